"""Import llama.cpp's own timing logs: what ``llama-cli`` and ``llama-perplexity`` print when they finish
(``llama_perf_context_print:`` lines, ``llama_print_timings:`` in builds before late 2024), as llama.cpp's CI
(ggml-org/ci) keeps them for every commit it tests: one log per weight format, holding a ``llama-cli`` run and a
``llama-perplexity`` run, each after its ``+ ./bin/<tool> ...`` command line.

- ``llama-cli`` (``main`` in older builds): ``eval time = T ms / N runs`` is N single-token decode steps after the
  prompt (``prompt eval time = ... / P tokens``): one decode point, N / T tokens per second from a context of P
  tokens. One run gives one figure (a mean over the N steps), so the record's spread is unknown.
- ``llama-perplexity``: ``prompt eval time = T ms / K tokens`` is K tokens evaluated in chunks of ``n_ctx``
  tokens, each from an empty cache, in ubatches of ``n_ubatch``: one prefill point of ``n_ctx`` tokens at
  K / T tokens per second. Perplexity asks for the logits of every token (a prompt asks for the last one's), so
  its output projection runs on every token and its logits are copied to the host: the record says so
  (``provenance.logits_all``).

The model's shape comes from the catalogue (``--model``); the log gives the build (``build: N (commit)``), the
device (``Device 0: <name>, compute capability``), the weight format (``model ftype``; when the loader guesses it,
the most common quantized tensor type), the file's size (``model size``, rounded to 0.01 GiB), the context and
micro-batch, flash attention, and the layers offloaded (``-ngl``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from calibration.import_schema import check_llama_log_run
from calibration.importers import (
    _DEVICE,
    _engine_version,
    _quantized_matmul,
    device_from_names,
    mean_summary,
    quant_from_model_type,
    read_result_file,
    store_new_records,
)
from harness import records
from harness.engines.llama_cpp.logparse import log_backend
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import resolve_quant

# "build: 4446 (4d2b3d880)"; "main: build = 2197 (46fd2737)" before late 2024
_BUILD = re.compile(r"build(?::|\s*=)\s*(\d+)\s*\(([0-9a-f]{6,40})\)")
_BATCH_FLAG = re.compile(r"(?:^|\s)(?:-b|--batch-size)\s+(\d+)")
_GENERATE_BATCH = re.compile(r"generate:.*?n_batch\s*=\s*(\d+)")
DEFAULT_N_BATCH = 512  # llama.cpp's default batch before it printed one (common.h, gpt_params.n_batch)
_COMMAND = re.compile(r"^\+\s*\S*?\b(llama-cli|llama-perplexity|main|perplexity)\s+(.*)$", re.MULTILINE)
_PROMPT_EVAL = re.compile(r"prompt eval time\s*=\s*([0-9.]+)\s*ms\s*/\s*(\d+)\s*tokens")
_EVAL = re.compile(r"(?<!prompt )eval time\s*=\s*([0-9.]+)\s*ms\s*/\s*(\d+)\s*runs")
_FTYPE = re.compile(r"(?:model ftype|file type)\s*=\s*(.+?)\s*$", re.MULTILINE)  # print_info: from early 2025
_TENSOR_TYPE = re.compile(r"- type\s+(\w+):\s+(\d+) tensors")
_SIZE = re.compile(r"(?:model|file) size\s*=\s*([0-9.]+)\s*(GiB|MiB)")
_PARAMS = re.compile(r"model params\s*=\s*([0-9.]+)\s*([BMK])")
_CONTEXT_FIELD = r"(?:llama_new_context_with_model|llama_context|llama_init_from_model):\s*{}\s*=\s*(\S+)"
_KV_TYPE = re.compile(r"K \((\w+)\):")
_NGL = re.compile(r"(?:^|\s)(?:-ngl|--n-gpu-layers|--gpu-layers)\s+(\d+)")
_THREADS = re.compile(r"(?:^|\s)(?:-t|--threads)\s+(\d+)")
_UNITS = {"GiB": 2**30, "MiB": 2**20}
_SCALE = {"B": 1e9, "M": 1e6, "K": 1e3}


def split_runs(text: str) -> list[tuple[str, str, str]]:
    """(tool, arguments, the run's text) for each ``+ ./bin/<tool> ...`` command in the log."""
    starts = list(_COMMAND.finditer(text))
    if not starts:
        raise BenchcalError("no llama-cli or llama-perplexity command line ('+ ./bin/llama-cli ...') in the log")
    runs = []
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        tool = {"main": "llama-cli", "perplexity": "llama-perplexity"}.get(match.group(1), match.group(1))
        runs.append((tool, match.group(2), text[match.start():end]))
    return runs


def _context_field(text: str, name: str) -> str | None:
    match = re.search(_CONTEXT_FIELD.format(re.escape(name)), text)
    return match.group(1) if match else None


def _quant(text: str) -> str | None:
    ftype = _FTYPE.search(text)
    if ftype and "guessed" not in ftype.group(1):
        return quant_from_model_type(ftype.group(1))
    counts = {name.upper(): int(n) for name, n in _TENSOR_TYPE.findall(text) if name.lower() != "f32"}
    if not counts:
        return None
    return resolve_quant(max(counts, key=counts.get), "llama.cpp").id


def parse_run(tool: str, arguments: str, text: str) -> dict[str, Any]:
    """What one run's lines say, in plain fields (checked by :func:`calibration.import_schema.check_llama_log_run`)."""
    build, device = _BUILD.search(text), _DEVICE.search(text)
    size, params = _SIZE.search(text), _PARAMS.search(text)
    prompt, decode = _PROMPT_EVAL.search(text), _EVAL.search(text)
    ngl, threads, kv = _NGL.search(arguments), _THREADS.search(arguments), _KV_TYPE.search(text)
    fields: dict[str, Any] = {
        "tool": tool, "command": arguments.strip(),
        "build_commit": build.group(2) if build else None, "build_number": int(build.group(1)) if build else None,
        "device_name": device.group(1).strip() if device else None, "quant": _quant(text),
        "model_size_bytes": int(round(float(size.group(1)) * _UNITS[size.group(2)])) if size else None,
        "model_params": int(round(float(params.group(1)) * _SCALE[params.group(2)])) if params else None,
        "n_gpu_layers": int(ngl.group(1)) if ngl else None, "threads": int(threads.group(1)) if threads else None,
        "kv_dtype": kv.group(1).lower() if kv else None, "quantized_matmul": _quantized_matmul(text),
        "backend": log_backend(text),
    }
    for name in ("n_ctx", "n_batch", "n_ubatch"):
        value = _context_field(text, name)
        fields[name] = int(value) if value and value.isdigit() else value
    if fields["n_batch"] is None:  # builds before early 2024 print no batch line: the flag, the generate line, 512
        found = _BATCH_FLAG.search(arguments) or _GENERATE_BATCH.search(text)
        fields["n_batch"] = int(found.group(1)) if found else DEFAULT_N_BATCH
    if fields["n_ubatch"] is None:  # before the micro-batch (llama.cpp PR #6017, March 2024) a batch ran whole
        fields["n_ubatch"] = fields["n_batch"]
    flash = _context_field(text, "flash_attn")
    fields["flash_attn"] = None if flash is None else flash not in ("0", "false", "disabled")
    if prompt:
        fields["prompt_eval_ms"], fields["prompt_tokens"] = float(prompt.group(1)), int(prompt.group(2))
    if decode and tool == "llama-cli":  # perplexity prints "eval time = 0.00 ms / 1 runs": it generates nothing
        fields["eval_ms"], fields["eval_runs"] = float(decode.group(1)), int(decode.group(2))
    return fields


def llama_log_record(run: dict[str, Any], *, model: str, device: str, file_name: str, source_url: str | None,
                     import_key: str, exclude: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A run record for one parsed run: llama-cli -> decode, llama-perplexity -> prefill; None when the run holds
    no timing of that kind."""
    options = {"n_gpu_layers": run["n_gpu_layers"] if run["n_gpu_layers"] is not None else 0,
               "flash_attn": bool(run["flash_attn"]), "n_batch": run["n_batch"], "n_ubatch": run["n_ubatch"]}
    if run["threads"] is not None:
        options["threads"] = run["threads"]
    config: dict[str, Any] = {"model": model, "quant": run["quant"], "engine": "llama.cpp", "device": device,
                              "weights": "imported", "device_count": 1, "context": run["n_ctx"], "batch": 1,
                              "kv_dtype": run["kv_dtype"] or "f16", "engine_options": options, "warmup": 1}
    provenance: dict[str, Any] = {
        "source": "imported", "imported_from": file_name, "import_format": f"llama.cpp log ({run['tool']})",
        "source_url": source_url, "import_key": import_key,
        "engine_version": _engine_version(run["build_number"], run["build_commit"]),
        "engine_commit": run["build_commit"], "device_name": run["device_name"],
        "weights_bytes": run["model_size_bytes"], "model_n_params": run["model_params"],
        "weights_bytes_note": "llama.cpp prints the size rounded to 0.01 GiB", "command": run["command"],
    }
    if run.get("backend"):
        provenance["backend"] = run["backend"]
    if run.get("quantized_matmul"):
        provenance["quantized_matmul"] = run["quantized_matmul"]
    if run["tool"] == "llama-cli":
        if "eval_ms" not in run:
            return None
        rate = 1000.0 * run["eval_runs"] / run["eval_ms"]
        context_at_start = run.get("prompt_tokens", 0)
        config.update(prompt_tokens=[], gen_tokens=run["eval_runs"], reps=1)
        measurements = {"decode": {"gen_tokens": run["eval_runs"], "context_at_start": context_at_start,
                                   "decode_tok_s": mean_summary(rate, None, 1, f"llama.cpp's eval time over {run['eval_runs']} "
                                                                 "decode steps: one mean, no spread")}}
        kind = "decode"
    else:
        if "prompt_eval_ms" not in run:
            return None
        chunk = int(run["n_ctx"])
        chunks = max(1, run["prompt_tokens"] // chunk)
        rate = 1000.0 * run["prompt_tokens"] / run["prompt_eval_ms"]
        config.update(prompt_tokens=[chunk], gen_tokens=0, reps=chunks)
        measurements = {"prefill": [{"prompt_tokens": chunk, "context_at_start": 0, "prefill_tok_s": mean_summary(
            rate, None, 1, f"llama-perplexity's prompt eval time over {run['prompt_tokens']} tokens ({chunks} chunks of "
                  f"{chunk}): one mean, no spread")}]}
        provenance["logits_all"] = True
        kind = "prefill"
    if exclude and exclude.get(kind):
        provenance["excluded_from_fit"] = {kind: exclude[kind]}
    return records.new_record(config, measurements=measurements, provenance=provenance,
                              prediction_reason="imported result; benchcal report recomputes predictions")


def import_llama_log(path: str | Path, *, model: str, runs_dir: str | Path, gpu: str | None = None,
                     source_url: str | None = None,
                     exclude: dict[str, str] | None = None) -> tuple[list[Path], list[str]]:
    """Import one llama.cpp log (llama-cli and/or llama-perplexity runs); returns (paths written, messages)."""
    file, text = read_result_file(path)
    runs = [parse_run(*run) for run in split_runs(text)]
    model_id = resolve_model(model).id
    for i, run in enumerate(runs):
        check_llama_log_run(run, file.name, i)
    device = device_from_names(gpu, (r["device_name"] for r in runs if r["device_name"]), f"the log {file.name}")

    def build(i: int, run: dict[str, Any], key: str) -> tuple[dict[str, Any] | None, str | None]:
        record = llama_log_record(run, model=model_id, device=device, file_name=file.name, source_url=source_url,
                                  import_key=key, exclude=exclude)
        return record, None if record is not None else f"{run['tool']} run without its timing lines; skipped"

    return store_new_records(text, runs, runs_dir, "run", build)
