"""Import the memory figures of a vLLM server's start-up log: the KV pool vLLM sized on a GPU.

A vLLM GPU worker loads the model, profiles one forward pass and gives its KV cache what is left of its share of
the device (``Model loading took X GiB``, ``Available KV cache memory: X GiB``, ``GPU KV cache size: N tokens``;
V0 builds: ``model weights take ...; the rest of the memory reserved for KV Cache is X GiB``). Such a log is one
record: no timing, its memory breakdown (:func:`harness.engines.vllm.logparse.parse_memory_breakdown`) and the
settings the pool depends on, which :mod:`calibration.kvpool` predicts the pool from.

The settings come from the log where it prints them (the engine's config line ``max_seq_len=N, ...,
enforce_eager=B, kv_cache_dtype=D``, ``non-default args: {...}``, the utilization in vLLM's memory lines, the
version in ``LLM engine (vX)``, FlashInfer's sampler in ``Using FlashInfer for top-p & top-k sampling``: its
sort-free kernel keeps none of the buffers ``vllm_sampler_copies`` counts) and otherwise from the options given (a published excerpt often lacks them: the
deployment file beside it says them); a setting found in neither is an error, except ``max_num_seqs`` and
``max_num_batched_tokens``, which default to the version's own defaults on the device
(:func:`predictor.memory.vllm_batch_defaults`, vLLM 0.32.0; older versions: see the record's provenance).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from calibration.importers import read_result_file, store_new_records
from harness import records
from harness.engines.vllm.logparse import parse_memory_breakdown
from predictor.devices import resolve_device
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import resolve_kv_dtype, resolve_quant

IMPORT_FORMAT = "vllm log (KV pool)"
SETTINGS = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
            "kv_cache_dtype", "vllm_version")

# Lines only vLLM's V0 engine printed (its worker's memory summary), which sized the pool from another profile run
# vLLM's sampler says so when it samples with FlashInfer's sort-free top-k/top-p kernel (v1/sample/ops/topk_topp_sampler.py)
FLASHINFER_SAMPLER = "Using FlashInfer for top-p & top-k sampling"
V0_MARKERS = ("the rest of the memory reserved for KV Cache", "Memory profiling results: total_gpu_memory=")
_VERSION = re.compile(r"(?:LLM engine \(v|API server version\s+v?)(\d+\.\d+[\w.+-]*)")
_NON_DEFAULT = re.compile(r"non-default args:\s*(\{.*\})")
_CONFIG_INT = r"\b{}=(\d+)"
_CONFIG_WORD = r"\b{}=(\w+)"
_UTILIZATION = (
    re.compile(r"current --gpu-memory-utilization=(\d*\.\d+)"),
    re.compile(r"increase --gpu-memory-utilization from (\d*\.\d+)"),
    re.compile(r"Desired GPU memory utilization is \((\d*\.\d+),"),
    re.compile(r"gpu_memory_utilization \((\d*\.\d+)\)"),
    re.compile(r"gpu_memory_utilization=(\d*\.\d+)"),
)


def _non_default_args(text: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for match in _NON_DEFAULT.finditer(text):
        try:
            value = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, dict):
            found.update(value)
    return found


def parse_settings(text: str) -> dict[str, Any]:
    """The settings the log prints (the keys of :data:`SETTINGS` it has)."""
    args = _non_default_args(text)
    out: dict[str, Any] = {}
    version = _VERSION.search(text)
    if version:
        out["vllm_version"] = version.group(1)
    for key in ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                "enforce_eager", "kv_cache_dtype"):
        if args.get(key) is not None:
            out[key] = args[key]
    for key, name in (("max_model_len", "max_seq_len"), ("max_num_batched_tokens", "max_num_batched_tokens"),
                      ("max_num_seqs", "max_num_seqs")):
        match = re.search(_CONFIG_INT.format(name), text)
        if key not in out and match:
            out[key] = int(match.group(1))
    for key in ("enforce_eager", "kv_cache_dtype"):
        match = re.search(_CONFIG_WORD.format(key), text)
        if key not in out and match:
            word = match.group(1)
            out[key] = word == "True" if key == "enforce_eager" else word
    if FLASHINFER_SAMPLER in text:
        out["sampler"] = "flashinfer"
    if "gpu_memory_utilization" not in out:
        printed = [match.group(1) for pattern in _UTILIZATION for match in pattern.finditer(text)]
        if printed:  # the most digits: vLLM rounds the figure in some lines
            out["gpu_memory_utilization"] = float(max(printed, key=lambda figure: len(figure.split(".")[1])))
    return out


def _settings(text: str, given: dict[str, Any], file_name: str) -> dict[str, Any]:
    settings = {key: value for key, value in given.items() if value is not None}
    settings.update(parse_settings(text))  # what the log prints wins
    for key in ("gpu_memory_utilization", "max_model_len"):
        if settings.get(key) is None:
            option = "--" + key.replace("_", "-")
            raise BenchcalError(f"{file_name}: the log does not print {key}; give it with {option}")
    utilization = float(settings["gpu_memory_utilization"])
    if not 0 < utilization <= 1:
        raise BenchcalError(f"{file_name}: gpu_memory_utilization must be in (0, 1], got {utilization}")
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if settings.get(key) is not None and int(settings[key]) <= 0:
            raise BenchcalError(f"{file_name}: {key} must be a positive integer, got {settings[key]}")
    settings["enforce_eager"] = bool(settings.get("enforce_eager", False))
    settings["vllm_engine"] = "V0" if any(marker in text for marker in V0_MARKERS) else "V1"
    return settings


def vllm_log_record(breakdown: dict[str, Any], settings: dict[str, Any], *, model: str, device: str, quant: str,
                    file_name: str, source_url: str | None, import_key: str) -> dict[str, Any]:
    """One record: the log's memory breakdown and the settings its pool was sized with."""
    kv_dtype = str(settings.get("kv_cache_dtype") or "auto")
    options = {"kv_pool": "profiled", "gpu_memory_utilization": float(settings["gpu_memory_utilization"]),
               "enforce_eager": settings["enforce_eager"]}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if settings.get(key) is not None:
            options[key] = int(settings[key])
    if settings.get("sampler"):
        options["sampler"] = settings["sampler"]
    config = {"model": model, "quant": quant, "engine": "vllm", "device": device, "weights": "imported",
              "device_count": 1, "context": int(settings["max_model_len"]), "batch": 1,
              "kv_dtype": "bf16" if kv_dtype == "auto" else resolve_kv_dtype(kv_dtype, "vllm").id,
              "prompt_tokens": [], "gen_tokens": 0, "reps": 1, "engine_options": options}
    breakdown = {key: value for key, value in breakdown.items() if key != "raw_lines"}
    breakdown["vllm_options"] = {**options, "max_model_len": int(settings["max_model_len"]),
                                 "kv_cache_dtype": kv_dtype}
    provenance = {"source": "imported", "imported_from": file_name, "import_format": IMPORT_FORMAT,
                  "source_url": source_url, "import_key": import_key,
                  "engine_version": settings.get("vllm_version"), "vllm_engine": settings["vllm_engine"]}
    return records.new_record(config, measurements={}, memory={"engine_breakdown": breakdown}, provenance=provenance,
                              prediction_reason="imported KV pool; benchcal calibrate predicts it")


def import_vllm_log(path: str | Path, *, model: str, runs_dir: str | Path, gpu: str, quant: str = "BF16",
                    source_url: str | None = None, **given: Any) -> tuple[list[Path], list[str]]:
    """Import one vLLM log's KV pool as a record; ``given``: settings (:data:`SETTINGS`) the log may lack.
    Returns (paths written, messages)."""
    unknown = set(given) - set(SETTINGS)
    if unknown:
        raise BenchcalError(f"unknown vLLM log setting(s): {', '.join(sorted(unknown))}")
    file, text = read_result_file(path)
    breakdown = parse_memory_breakdown(text)
    if not breakdown.get("kv_bytes") or not breakdown.get("weights_bytes"):
        raise BenchcalError(f"{file.name}: no KV pool in the log (expected vLLM's 'Model loading took X GiB' and "
                            "'Available KV cache memory: X GiB' lines)")
    device = resolve_device(gpu)
    if device.kind != "gpu":
        raise BenchcalError(f"{file.name}: {device.id} is not a discrete GPU; vLLM logs are imported for GPUs")
    model_id = resolve_model(model).id
    quant_id = resolve_quant(quant, "vllm").id
    settings = _settings(text, given, file.name)

    def build(i: int, item: Any, key: str) -> tuple[dict[str, Any] | None, str | None]:
        return vllm_log_record(breakdown, settings, model=model_id, device=device.id, quant=quant_id,
                               file_name=file.name, source_url=source_url, import_key=key), None

    return store_new_records(text, [breakdown], runs_dir, "log", build)
