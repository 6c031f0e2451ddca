"""Import a model vendor's published vLLM speed table: Qwen's speed benchmark pages (``speed_benchmark.rst`` of the
Qwen2 and Qwen2.5 documentation), reStructuredText grid tables of one model size each::

    -  0.5B (vLLM)

    +-------------------------+--------------+--------------+---------+-----------------+
    | Model                   | Input Length | Quantization | GPU Num | Speed(tokens/s) |
    +=========================+==============+==============+=========+=================+
    | Qwen2.5-0.5B-Instruct   | 1            | BF16         | 1       | 311.55          |
    +                         +              +--------------+---------+-----------------+
    |                         |              | GPTQ-Int8    | 1       | 257.07          |

A blank cell continues the one above it (a row span). Only the ``(vLLM)`` sections are read; the page's
"environment of the evaluation with vLLM" list gives the vLLM version and the GPU. Each row is one batch-1
request generating ``output_len`` (2048) tokens after a prompt of the input length; its speed is the
generated tokens over the whole ``generate()`` call (Qwen's speed_benchmark_vllm.py: ``out_length / time``), so
it includes the prompt's prefill. A record is a decode run from ``context_at_start`` = input length, and rows
whose prompt is longer than ``max_input`` are left out (their prefill is no longer a small part of the call).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from calibration.importers import mean_summary, read_result_file, store_new_records
from harness import records
from predictor.devices import resolve_device
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import resolve_quant

_SECTION = re.compile(r"^-\s+(\S+)\s+\(vLLM\)\s*$")
_VLLM_ENV = re.compile(r"evaluation with vLLM is:(.*?)(?:\n\s*\n(?!-))", re.DOTALL)
_VERSION = re.compile(r"^-\s+vLLM\s+(\d+\.\d+\.\d+\S*)\s*$", re.MULTILINE)
_GPU = re.compile(r"^-\s+(NVIDIA\s+.+?)\s*$", re.MULTILINE)
COLUMNS = ("Model", "Input Length", "Quantization", "GPU Num", "Speed(tokens/s)")


def parse_environment(text: str) -> tuple[str, str]:
    """(vLLM version, GPU name) from the page's list of the vLLM evaluation's environment."""
    found = _VLLM_ENV.search(text)
    block = found.group(1) if found else ""
    version, gpu = _VERSION.search(block), _GPU.search(block)
    if not version or not gpu:
        raise BenchcalError("no 'environment of the evaluation with vLLM' list naming the vLLM version and the GPU")
    return version.group(1), gpu.group(1)


def parse_speed_tables(text: str) -> list[dict[str, Any]]:
    """The rows of every ``(vLLM)`` table: ``{section, model_name, input_len, quantization, gpu_num, speed}``."""
    rows: list[dict[str, Any]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _SECTION.match(lines[i].strip())
        i += 1
        if not match:
            continue
        section = match.group(1)
        while i < len(lines) and not lines[i].startswith("+"):
            i += 1
        header: list[str] | None = None
        carried = [""] * len(COLUMNS)
        while i < len(lines) and (lines[i].startswith("+") or lines[i].startswith("|")):
            line = lines[i]
            i += 1
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                if tuple(cells[:len(COLUMNS)]) != COLUMNS:
                    raise BenchcalError(f"section {section} (vLLM): expected the columns {', '.join(COLUMNS)}, "
                                        f"got {', '.join(cells)}")
                continue
            cells = [c or carried[j] for j, c in enumerate(cells[:len(COLUMNS)])]
            carried = cells
            try:
                rows.append({"section": section, "model_name": cells[0], "input_len": int(cells[1]),
                             "quantization": cells[2], "gpu_num": int(cells[3]), "speed": float(cells[4])})
            except ValueError:
                raise BenchcalError(f"section {section} (vLLM): unreadable row {line.strip()!r}") from None
    if not rows:
        raise BenchcalError("no '(vLLM)' speed table found (a '-  <size> (vLLM)' line before a grid table)")
    return rows


# The page's quantization names as the catalogue's vLLM formats (GPTQ-Int8 has none: left out)
QUANTS = {"BF16": "BF16", "GPTQ-Int4": "GPTQ", "AWQ": "AWQ"}


def speed_record(row: dict[str, Any], *, model: str, device: str, quant: str, version: str, gpu_name: str,
                 output_len: int, max_model_len: int, gpu_memory_utilization: float, file_name: str,
                 source_url: str | None, import_key: str) -> dict[str, Any]:
    """A run record for one row: a batch-1 vLLM decode run from a prompt of the row's input length."""
    config = {
        "model": model, "quant": quant, "engine": "vllm", "device": device, "weights": "imported",
        "device_count": int(row["gpu_num"]), "context": int(max_model_len), "batch": 1, "kv_dtype": "bf16",
        "prompt_tokens": [int(row["input_len"])], "gen_tokens": int(output_len), "reps": 1, "warmup": 1,
        "engine_options": {"gpu_memory_utilization": gpu_memory_utilization, "max_model_len": int(max_model_len),
                           "enforce_eager": False},
    }
    decode = {"gen_tokens": int(output_len), "context_at_start": int(row["input_len"]),
              "decode_tok_s": mean_summary(float(row["speed"]), None, 1, f"the table's speed: {output_len} generated "
                                           "tokens over the whole generate() call, the prompt's prefill included")}
    provenance = {
        "source": "imported", "imported_from": file_name, "import_format": "vendor speed table (vLLM)",
        "source_url": source_url, "import_key": import_key, "engine_version": f"vllm {version}",
        "device_name": gpu_name, "model_id": row["model_name"], "table_section": f"{row['section']} (vLLM)",
        "table_quantization": row["quantization"],
    }
    return records.new_record(config, measurements={"decode": decode}, provenance=provenance,
                              prediction_reason="imported result; benchcal report recomputes predictions")


def import_speed_table(path: str | Path, *, models: dict[str, str], runs_dir: str | Path, gpu: str,
                       source_url: str | None = None, output_len: int = 2048, max_model_len: int = 32768,
                       gpu_memory_utilization: float = 0.9,
                       max_input: int = 6144) -> tuple[list[Path], list[str]]:
    """Import one speed page; ``models`` maps the table's model names (``Qwen2.5-7B-Instruct``) to catalogue models
    (a name it does not map is left out with a message); returns (paths written, messages)."""
    file, text = read_result_file(path)
    version, gpu_name = parse_environment(text)
    device = resolve_device(gpu).id
    catalogue = {name: resolve_model(model).id for name, model in models.items()}
    rows = parse_speed_tables(text)

    def left_out(row: dict[str, Any]) -> str | None:
        if row["model_name"] not in catalogue:
            return f"{row['model_name']} is not mapped to a catalogue model; left out"
        if row["quantization"] not in QUANTS:
            return f"{row['quantization']} has no catalogue format; left out"
        if row["input_len"] > max_input:
            return (f"a {row['input_len']}-token prompt: its prefill is no small part of the call beyond {max_input} "
                    "tokens; left out")
        return None

    def build(i: int, row: dict[str, Any], key: str) -> tuple[dict[str, Any] | None, str | None]:
        reason = left_out(row)
        if reason:
            return None, reason
        quant = resolve_quant(QUANTS[row["quantization"]], "vllm").id
        return speed_record(row, model=catalogue[row["model_name"]], device=device, quant=quant, version=version,
                            gpu_name=gpu_name, output_len=output_len, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization, file_name=file.name,
                            source_url=source_url, import_key=key), None

    return store_new_records(text, rows, runs_dir, "row", build)
