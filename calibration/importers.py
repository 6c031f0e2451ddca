"""Import results people already have: llama-bench (md, csv, json, jsonl) and vLLM's benchmark files.

Each imported test becomes a run record (``harness.records.new_record`` / ``write_record``) with
``provenance.source = "imported"``, the file's name and, when given, the URL it came from. Records
calibrate like measured runs: a llama-bench ``pp`` row gives a prefill point, a ``tg`` row a decode
point (its mean KV context is ``n_depth + n_gen / 2``); ``pp+tg`` rows mix both and are skipped.

llama-bench fields (its README, "Output formats"): ``build_commit``, ``build_number``, ``gpu_info``,
``backends``, ``model_type`` ("llama 8B Q4_K - Medium"), ``model_size`` (bytes), ``model_n_params``,
``n_batch``, ``n_ubatch``, ``n_threads``, ``type_k``, ``type_v``, ``n_gpu_layers``, ``flash_attn``,
``n_prompt``, ``n_gen``, ``n_depth``, ``avg_ts``, ``stddev_ts``, ``samples_ts``. The markdown table
holds only the columns that differ from the defaults, sizes rounded to 0.01 GiB and "mean +- stddev";
the build line ("build: 4426e298 (2824)") and CUDA's device line ("Device 0: NVIDIA GeForce RTX 4090,
compute capability 8.9") are read from the same text when present.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from calibration.import_schema import check_llama_bench_row, csv_row
from harness import records
from predictor.devices import resolve_device
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import resolve_quant

# llama-bench's defaults for columns its markdown leaves out (tools/llama-bench/llama-bench.cpp,
# ``cmd_params_defaults``): 5 repetitions, n_batch 2048, n_ubatch 512, f16 KV, 99 GPU layers, no flash attn.
LLAMA_BENCH_DEFAULTS = {"n_batch": 2048, "n_ubatch": 512, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99,
                        "flash_attn": False, "repetitions": 5}
# llama.cpp's file-type names (``llama_model_ftype_name``) -> our quant ids.
FTYPE_NAMES = {
    "Q4_K - Medium": "Q4_K_M", "Q4_K - Small": "Q4_K_S", "Q5_K - Medium": "Q5_K_M", "Q5_K - Small": "Q5_K_S",
    "Q3_K - Medium": "Q3_K_M", "Q3_K - Small": "Q3_K_S", "Q3_K - Large": "Q3_K_L", "Q2_K - Medium": "Q2_K",
    "IQ4_XS - 4.25 bpw": "IQ4_XS", "IQ4_NL - 4.5 bpw": "IQ4_NL", "MXFP4 MoE": "MXFP4",
}
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_TEST = re.compile(r"^(?:(pp|tg)\s*(\d+)|pp\s*(\d+)\s*\+\s*tg\s*(\d+))(?:\s*@\s*d\s*(\d+))?$")
_BUILD = re.compile(r"build:?\s*([0-9a-f]{6,40})\s*\((\d+)\)")  # "build: 4426e298 (2824)", "build e9fd8dc (7825)"
# A commit named without its build number, as in "`llama.cpp`(@ca0ef2dd...):" above a pasted table.
_COMMIT_AT = re.compile(r"`llama\.cpp`\s*\(@([0-9a-f]{7,40})\)")
# The repetitions of a llama-bench command line pasted beside its table ("-r 2"): the table does not show them.
_REPETITIONS = re.compile(r"llama-bench\b[^\n]*?\s(?:-r|--repetitions)\s+(\d+)")
_DEVICE = re.compile(r"Device \d+:\s*([^,\n]+?)\s*,\s*compute capability")
# ggml_cuda_init's lines in CUDA builds before llama.cpp PR #8075 (June 2024): with tensor cores and MMQ not
# forced, matmuls of quantized weights on more than 32 tokens dequantize the weights to an FP16 buffer in
# device memory and call cuBLAS (PR #3776); later builds use the int8 MMQ kernels and print neither line.
_TENSOR_CORES = re.compile(r"CUDA_USE_TENSOR_CORES:\s*(yes|no)")
_FORCE_MMQ = re.compile(r"GGML_CUDA_FORCE_MMQ:\s*(yes|no)")
_MEAN_STD = re.compile(r"^\s*([0-9.]+)\s*(?:±|\+-|\+/-)\s*([0-9.]+)\s*$")


# ------------------------------------------------------------------------------------------- parsing


def _is_compare_header(cells: list[str]) -> bool:
    """A ``scripts/compare-llama-bench.py`` table: ``Model``, ``Test`` and one ``t/s <build>`` column per build."""
    return "Model" in cells and "Test" in cells and any(c.startswith("t/s ") for c in cells)


def _md_rows(text: str) -> list[dict[str, str]]:
    """Rows of every llama-bench markdown table in ``text`` as {column: cell}, and of every table
    ``scripts/compare-llama-bench.py`` prints (its columns capitalized: ``Model``, ``Test``, ``t/s <build>``)."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        if header is None:
            header = cells if ("test" in cells and "model" in cells) or _is_compare_header(cells) else None
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _size_bytes(text: str) -> int | None:
    match = re.match(r"^\s*([0-9.]+)\s*(B|KiB|MiB|GiB|TiB)\s*$", text or "")
    return int(round(float(match.group(1)) * _UNITS[match.group(2)])) if match else None


def _parse_test(name: str) -> tuple[int, int, int] | None:
    """(n_prompt, n_gen, n_depth) of a test name: "pp 512", "tg128", "pp512+tg128", "pp512 @ d512"."""
    match = _TEST.match(name.strip())
    if not match:
        return None
    kind, n, pp, tg, depth = match.groups()
    d = int(depth or 0)
    if kind == "pp":
        return int(n), 0, d
    if kind == "tg":
        return 0, int(n), d
    return int(pp), int(tg), d


# compare-llama-bench columns that change a test's settings; a row with one is not the default test
_COMPARE_SETTINGS = ("Batch size", "Microbatch size", "Threads", "Flash attention", "KV type")


def _compare_to_fields(row: dict[str, str], text: str) -> dict[str, Any] | None:
    """One row of a compare-llama-bench table in llama-bench's json field names: the first ``t/s`` column (the
    baseline build the comparison ran against) as the result, without a spread (the table has none). None for a
    row that is not a test or that sets what the plain llama-bench test leaves at its default."""
    test = _parse_test(row.get("Test", ""))
    column = next(c for c in row if c.startswith("t/s "))
    try:
        rate = float(row[column])
    except ValueError:
        return None
    if test is None or any(row.get(c) not in (None, "") for c in _COMPARE_SETTINGS):
        return None
    return {"model_type": row.get("Model"), "n_prompt": test[0], "n_gen": test[1], "n_depth": test[2],
            "avg_ts": rate, "stddev_ts": None, "build_commit": None, "build_number": None,
            "gpu_info": row.get("GPU") or None, "compare_column": column}


def _md_to_fields(row: dict[str, str], text: str) -> dict[str, Any] | None:
    """One markdown row in llama-bench's json field names (None for rows that are not a test)."""
    if "Model" in row and "Test" in row:
        return _compare_to_fields(row, text)
    test = _parse_test(row.get("test", ""))
    rate = _MEAN_STD.match(row.get("t/s", ""))
    if test is None or rate is None:
        return None
    build = _BUILD.search(text)
    commit_at = _COMMIT_AT.search(text)
    repetitions = _REPETITIONS.search(text)
    devices = _DEVICE.findall(text)
    fields: dict[str, Any] = {
        "model_type": row.get("model"),
        "model_size": _size_bytes(row.get("size", "")),
        "backends": row.get("backend"),
        "n_prompt": test[0], "n_gen": test[1], "n_depth": test[2],
        "avg_ts": float(rate.group(1)), "stddev_ts": float(rate.group(2)),
        "build_commit": build.group(1) if build else (commit_at.group(1) if commit_at else None),
        "build_number": int(build.group(2)) if build else None,
        "gpu_info": ", ".join(devices) if devices else None,
        "n_devices": len(devices) or None,
        "quantized_matmul": _quantized_matmul(text),
    }
    if repetitions:
        fields["repetitions"] = int(repetitions.group(1))
    for column, key, cast in (("ngl", "n_gpu_layers", int), ("n_batch", "n_batch", int), ("n_ubatch", "n_ubatch", int),
                              ("threads", "n_threads", int), ("type_k", "type_k", str), ("type_v", "type_v", str),
                              ("fa", "flash_attn", lambda v: v not in ("0", "off", "false"))):
        if row.get(column) not in (None, ""):
            fields[key] = cast(row[column])
    return fields


def _quantized_matmul(text: str) -> str | None:
    """``cublas-fp16`` when the log says large-batch matmuls of quantized weights go through an FP16 copy
    and cuBLAS (see ``_TENSOR_CORES``), else None (not stated: current builds use MMQ)."""
    tensor_cores, force_mmq = _TENSOR_CORES.search(text), _FORCE_MMQ.search(text)
    if tensor_cores and tensor_cores.group(1) == "yes" and not (force_mmq and force_mmq.group(1) == "yes"):
        return "cublas-fp16"
    return None


def detect_format(path: Path, text: str) -> str:
    """md, csv, json or jsonl, from the extension, else from the content."""
    suffix = path.suffix.lower().lstrip(".")
    if suffix in ("md", "csv", "json", "jsonl"):
        return suffix
    head = text.lstrip()[:1]
    if head == "[":
        return "json"
    if head == "{":
        return "jsonl" if len([ln for ln in text.splitlines() if ln.strip()]) > 1 else "json"
    if head == "|" or "| model" in text:
        return "md"
    return "csv"


def parse_llama_bench(text: str, fmt: str) -> list[dict[str, Any]]:
    """llama-bench output -> list of rows in its json field names."""
    try:
        if fmt == "md":
            rows = [_md_to_fields(r, text) for r in _md_rows(text)]
            return [r for r in rows if r is not None]
        if fmt == "json":
            data = json.loads(text)
            rows = list(data) if isinstance(data, list) else [data]
        elif fmt == "jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = [csv_row(dict(r)) for r in csv.DictReader(io.StringIO(text))]
    except (json.JSONDecodeError, csv.Error) as exc:
        raise BenchcalError(f"not valid llama-bench {fmt} output: {exc}") from None
    return [r for r in rows if isinstance(r, dict) and "avg_ts" in r]  # a test result, not some other table


# ------------------------------------------------------------------------------------------- mapping


def quant_from_model_type(model_type: str) -> str:
    """Our quant id from llama-bench's ``model_type`` ("llama 8B Q4_K - Medium" -> Q4_K_M)."""
    text = re.sub(r"\bmostly\s+", "", str(model_type or ""))
    for name, quant in FTYPE_NAMES.items():
        if text.endswith(name):
            return quant
    last = text.split()[-1] if text.split() else ""
    try:
        return resolve_quant(last, "llama.cpp").id
    except BenchcalError:
        raise BenchcalError(f"cannot tell the quant of model_type {model_type!r}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "off", "", "-1")
    return bool(value) and value != -1


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def _summary(row: dict[str, Any], repetitions: int) -> dict[str, Any]:
    """Summary of llama-bench's t/s: from its samples when present, else its mean and stddev."""
    samples = row.get("samples_ts")
    if isinstance(samples, list) and samples:
        return records.summarize(float(s) for s in samples)
    std = row.get("stddev_ts")
    statistic = ("compare-llama-bench prints the mean only; median is the mean" if row.get("compare_column")
                 else "llama-bench reports the mean and stddev only; median is the mean")
    return mean_summary(float(row["avg_ts"]), float(std) if std not in (None, "") else None, int(repetitions),
                        statistic)


def mean_summary(mean: float, stddev: float | None, n: int, statistic: str) -> dict[str, Any]:
    """A record summary from a tool that reports a mean (and maybe its spread) but not its samples."""
    return {"samples": [], "median": mean, "mean": mean, "stddev": stddev, "p10": None, "p90": None, "n": n,
            "statistic": statistic}


def llama_bench_record(row: dict[str, Any], *, model: str, device: str, file_name: str, file_format: str,
                       source_url: str | None, import_key: str, gpu_count: int | None = None,
                       exclude: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A run record for one llama-bench row (checked first: :func:`calibration.import_schema.check_llama_bench_row`);
    None for pp+tg rows."""
    n_prompt, n_gen, n_depth = (int(row.get(k) or 0) for k in ("n_prompt", "n_gen", "n_depth"))
    if (n_prompt and n_gen) or not (n_prompt or n_gen):
        return None
    quant = quant_from_model_type(str(row.get("model_type")))
    reps = _int(row.get("repetitions")) or LLAMA_BENCH_DEFAULTS["repetitions"]
    ngl = _int(row.get("n_gpu_layers"), LLAMA_BENCH_DEFAULTS["n_gpu_layers"])
    options = {
        "n_gpu_layers": ngl,
        "flash_attn": _bool(row.get("flash_attn", LLAMA_BENCH_DEFAULTS["flash_attn"])),
        "n_batch": _int(row.get("n_batch"), LLAMA_BENCH_DEFAULTS["n_batch"]),
        "n_ubatch": _int(row.get("n_ubatch"), LLAMA_BENCH_DEFAULTS["n_ubatch"]),
    }
    if row.get("n_threads") not in (None, ""):
        options["threads"] = _int(row["n_threads"])
    config = {
        "model": model, "quant": quant, "engine": "llama.cpp", "device": device, "weights": "imported",
        "device_count": int(gpu_count or row.get("n_devices") or 1),
        "context": n_prompt + n_gen + n_depth, "batch": 1,
        "kv_dtype": str(row.get("type_k") or LLAMA_BENCH_DEFAULTS["type_k"]).lower(),
        "prompt_tokens": [n_prompt] if n_prompt else [], "gen_tokens": n_gen, "reps": reps, "warmup": 1,
        "engine_options": options,
    }
    summary = _summary(row, reps)
    if n_prompt:
        measurements = {"prefill": [{"prompt_tokens": n_prompt, "context_at_start": n_depth, "prefill_tok_s": summary}]}
    else:
        measurements = {"decode": {"gen_tokens": n_gen, "context_at_start": n_depth, "decode_tok_s": summary}}
    commit, number = row.get("build_commit"), row.get("build_number")
    provenance = {
        "source": "imported", "imported_from": file_name, "import_format": f"llama-bench {file_format}",
        "source_url": source_url, "import_key": import_key,
        "engine_version": _engine_version(number, commit), "engine_commit": commit,
        "device_name": row.get("gpu_info") or None, "backends": row.get("backends"), "cpu_model": row.get("cpu_info"),
        "model_type": row.get("model_type"), "model_filename": row.get("model_filename"),
        "weights_bytes": _int(row.get("model_size")), "model_n_params": _int(row.get("model_n_params")),
        "started_at": row.get("test_time"),
    }
    if row.get("quantized_matmul"):
        provenance["quantized_matmul"] = row["quantized_matmul"]
    if row.get("compare_column"):
        provenance["compare_column"] = row["compare_column"]  # the comparison's baseline build, unnamed
    kind = "prefill" if n_prompt else "decode"
    if exclude and exclude.get(kind):
        provenance["excluded_from_fit"] = {kind: exclude[kind]}
    if file_format == "md" and row.get("model_size"):
        provenance["weights_bytes_note"] = "llama-bench markdown rounds the size to 0.01 GiB"
    if row.get("compare_column"):
        provenance["import_format"] = "compare-llama-bench md (its baseline column)"
    return records.new_record(config, measurements=measurements, provenance=provenance,
                              prediction_reason="imported result; benchcal report recomputes predictions")


def _engine_version(number: Any, commit: Any) -> str | None:
    """"llama.cpp build 2824 (4426e298)", or "llama.cpp commit ca0ef2ddd" when only the commit is known."""
    if not commit:
        return None
    return f"llama.cpp build {number} ({commit})" if number not in (None, "") else f"llama.cpp commit {str(commit)[:9]}"


def _device_id(gpu: str | None, rows: list[dict[str, Any]]) -> str:
    """The catalogue id of the GPU: the --gpu flag, else the file's gpu_info / CUDA device line."""
    return device_from_names(gpu, (str(r.get("gpu_info")).split(",")[0].strip() for r in rows if r.get("gpu_info")))


def device_from_names(gpu: str | None, names: Iterable[str], source: str = "the file") -> str:
    """The catalogue id of the device: the --gpu flag, else the one device name ``source`` gives."""
    found_names = set(names)
    name = gpu or (found_names.pop() if len(found_names) == 1 else None)
    if not name:
        found = ", ".join(sorted(found_names)) or "none"
        raise BenchcalError(f"cannot tell the GPU from {source} (found: {found}); pass --gpu")
    if name.strip().lower() == "cpu":
        return "cpu"
    return resolve_device(name).id


def existing_import_keys(runs_dir: str | Path) -> set[str]:
    """Import keys already stored, so importing a file twice adds nothing."""
    keys = set()
    for stored in records.iter_records(runs_dir, on_error=lambda path, message: None):
        key = (stored.record.get("provenance") or {}).get("import_key")
        if key:
            keys.add(key)
    return keys


def read_result_file(path: str | Path) -> tuple[Path, str]:
    """A result file's path and text; a missing file is a BenchcalError."""
    file = Path(path)
    if not file.is_file():
        raise BenchcalError(f"file not found: {file}")
    return file, file.read_text(encoding="utf-8", errors="replace")


def store_new_records(text: str, items: list[Any], runs_dir: str | Path, label: str,
                      build: Callable[[int, Any, str], tuple[dict[str, Any] | None, str | None]]
                      ) -> tuple[list[Path], list[str]]:
    """Write one record per item not imported before (keyed by the file's digest and the item's position).

    ``build(i, item, import_key)`` returns (record or None to skip, message or None). Returns (paths, messages).
    """
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    built, messages = [], []
    with records.store_lock(runs_dir):  # another import of the same file waits, then finds these records
        seen = existing_import_keys(runs_dir)
        for i, item in enumerate(items):  # every item is built (and checked) before any is stored
            key = f"{digest}:{i}"
            if key in seen:
                messages.append(f"{label} {i + 1}: already imported")
                continue
            record, message = build(i, item, key)
            if message:
                messages.append(f"{label} {i + 1}: {message}")
            if record is not None:
                built.append(records.sanitize_record(record))
        written = [records.write_record(record, runs_dir) for record in built]
    return written, messages


def import_llama_bench(path: str | Path, *, model: str, runs_dir: str | Path, gpu: str | None = None,
                       source_url: str | None = None, gpu_count: int | None = None,
                       exclude: dict[str, str] | None = None) -> tuple[list[Path], list[str]]:
    """Import one llama-bench output file; returns (paths written, messages about skipped rows).

    ``exclude`` maps "prefill" / "decode" to a reason: those rows are stored with
    ``provenance.excluded_from_fit`` and calibration reports them without fitting or scoring them.
    """
    file, text = read_result_file(path)
    fmt = detect_format(file, text)
    rows = parse_llama_bench(text, fmt)
    if not rows:
        raise BenchcalError(f"{file}: no llama-bench results found (expected {fmt} output of llama-bench)")
    model_id = resolve_model(model).id
    device = _device_id(gpu, rows)

    for i, row in enumerate(rows):
        check_llama_bench_row(row, file.name, i)

    def build(i: int, row: dict[str, Any], key: str) -> tuple[dict[str, Any] | None, str | None]:
        record = llama_bench_record(row, model=model_id, device=device, file_name=file.name, file_format=fmt,
                                    source_url=source_url, import_key=key, gpu_count=gpu_count, exclude=exclude)
        return record, None if record is not None else "pp+tg test mixes prefill and decode; skipped"

    return store_new_records(text, rows, runs_dir, "row", build)
