"""Stored run records as the three observation tables calibration fits: decode, prefill and memory.

Every table holds one row per observation with what the predictor needs to rebuild the exact
configuration (model and architecture overrides, quant, device, context, engine options) and the
measured value with its unit in the column name:

- decode: one row per run with a decode measurement; ``decode_step_s`` (seconds per token at batch 1,
  per step for a batch) and ``decode_context`` (mean tokens in the KV cache during the measurement);
- prefill: one row per (run, prompt length); ``prefill_s`` (seconds for the prompt) and ``ttft_s``;
- memory: one row per run with a sampled peak; ``peak_memory_bytes``.

The records are read with :func:`harness.records.iter_records` (the run-record contract); failed runs
are kept in the ``runs`` table with their status so reports can list them.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pandas as pd

from harness import record_tables, records
from harness.hostinfo import record_host_id
from predictor.backends import find_backend
from predictor.eras import run_era
from predictor.errors import BenchcalError

DEFAULT_DECODE_PROMPT_TOKENS = 16  # the harness's decode prompt when a run has no prompt lengths

RUN_COLUMNS = (
    "id", "status", "reason", "source", "model", "arch_overrides", "model_key", "quant", "engine", "device",
    "device_count", "context", "batch", "kv_dtype", "n_gpu_layers", "flash_attn", "n_ubatch",
    "offload_fraction", "weights_bytes", "host_bandwidth_gbs", "host_matmul_gflops", "host_memory_gib", "host_id",
    "engine_version", "era", "backend", "quantized_matmul", "prediction_error", "pred_verdict", "excluded_from_fit", "source_set",
    "logits_all", "path",
)

DECODE_COLUMNS = ("decode_tok_s", "decode_step_s", "decode_context", "gen_tokens", "rel_std", "exclude_reason")
PREFILL_COLUMNS = ("prompt_tokens", "prompt_depth", "prefill_tok_s", "prefill_s", "ttft_s", "rel_std", "exclude_reason")
MEMORY_COLUMNS = ("peak_memory_bytes", "peak_source", "engine_weights_bytes", "engine_kv_bytes", "engine_compute_bytes",
                  "engine_non_kv_bytes", "engine_node_total_bytes", "engine_kv_pool", "engine_memory_utilization",
                  "exclude_reason")


@dataclass
class Observations:
    """The runs table and the three observation tables made from it (pandas DataFrames)."""

    runs: pd.DataFrame
    decode: pd.DataFrame
    prefill: pd.DataFrame
    memory: pd.DataFrame

    def __len__(self) -> int:
        return len(self.runs)


def _summary_value(summary: Any) -> float | None:
    """The median of a stored summary, else its mean (llama-bench markdown keeps only mean +- stddev)."""
    if not isinstance(summary, dict):
        return None
    for key in ("median", "mean"):
        value = summary.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def _relative_stddev(summary: Any) -> float | None:
    """Relative spread of the repetitions: 1.4826 x MAD / median from the samples when there are at least
    three (robust to one disturbed repetition), else stddev / mean (llama-bench keeps only those)."""
    if not isinstance(summary, dict):
        return None
    samples = [float(x) for x in summary.get("samples") or [] if isinstance(x, (int, float))]
    if len(samples) >= 3:
        median = statistics.median(samples)
        if median > 0:
            return 1.4826 * statistics.median(abs(x - median) for x in samples) / median
    mean, std = summary.get("mean"), summary.get("stddev")
    if isinstance(mean, (int, float)) and mean > 0 and isinstance(std, (int, float)):
        return float(std) / float(mean)
    return None


def model_key(model: str, overrides: dict[str, Any] | None) -> str:
    """A model's identity for cross-validation: its id, plus the overrides of a shrunk architecture."""
    if not overrides:
        return str(model)
    parts = ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
    return f"{model}[{parts}]"


THREAD_KINDS = ("issues", "pull", "discussions")  # GitHub URLs naming a thread rather than a repository's file


def url_source(url: str | None) -> str | None:
    """Who published the results at ``url``: a GitHub repository (``owner/name``), or its thread
    (``owner/name#N``) for an issue, pull request or discussion; else the host and path; None without a URL."""
    if not url:
        return None
    parts = urlsplit(str(url))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if parts.netloc.lower() in ("github.com", "www.github.com") and len(path) >= 2:
        repo = f"{path[0]}/{path[1]}"
        if len(path) >= 4 and path[2] in THREAD_KINDS:
            return f"{repo}#{path[3]}"
        return repo
    return (parts.netloc + "/" + "/".join(path)).strip("/") or None


@lru_cache(maxsize=1)
def _shipped_excerpts() -> tuple[dict[tuple[str, str], str], dict[str, frozenset[str]]]:
    """The shipped public excerpts (``tests/data/imported/sources.json``): (file name, URL) -> set folder, and
    each folder's publishers (:func:`url_source` of its URLs). Empty where the manifest is not installed."""
    from calibration.public_data import load_manifest

    try:
        manifest = load_manifest()
    except (BenchcalError, OSError, ValueError):
        return {}, {}
    folders: dict[tuple[str, str], str] = {}
    publishers: dict[str, set[str]] = {}
    for entry in manifest:
        file = str(entry.get("file") or "")
        if "/" not in file:
            continue
        folder, name = file.split("/", 1)[0], file.rsplit("/", 1)[-1]
        folders[(name, str(entry.get("url") or ""))] = folder
        publishers.setdefault(folder, set()).add(url_source(entry.get("url")) or folder)
    return folders, {folder: frozenset(keys) for folder, keys in publishers.items()}


def imported_source_set(file: str | None, url: str | None) -> str:
    """The source group of an imported record: the set (folder of ``tests/data/imported``) its excerpt came
    from, or, where that folder gathers several publishers' posts (``apple-silicon``: three threads by three
    people), ``<set>:<repository or thread>``. A record imported from elsewhere is grouped by its URL's
    repository or thread (``imported:<owner/name>``), else by its file name."""
    name = str(file or "")
    folders, publishers = _shipped_excerpts()
    folder = name.split("/", 1)[0] if "/" in name else folders.get((name, str(url or "")))
    publisher = url_source(url)
    if folder is None:
        return f"imported:{publisher or name or 'unknown'}"
    if len(publishers.get(folder, ())) > 1 and publisher:
        return f"{folder}:{publisher}"
    return folder


def source_set(record: dict[str, Any]) -> str:
    """Who produced a run, for leave-one-source-out cross-validation: an imported record's set (see
    :func:`imported_source_set`); a measured run's machine, ``measured:<host_id>`` on a CPU and
    ``measured:<device>`` on an accelerator (one machine's runs share its setup and its disturbances)."""
    prov = record.get("provenance") or {}
    config = record.get("config") or {}
    if prov.get("source") == "imported":
        return imported_source_set(prov.get("imported_from"), prov.get("source_url"))
    device = config.get("device")
    if device == "cpu":
        return f"measured:{record_host_id(prov) or 'cpu'}"
    return f"measured:{device}"


def run_row(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The configuration of one run, flat (see ``RUN_COLUMNS``), with the defaults the fits assume filled in."""
    base = record_tables.common_columns(path, record)
    prov = record.get("provenance") or {}
    overrides = base["arch_overrides"]
    host_memory = base["host_memory_bytes"]
    prediction = record.get("prediction") or {}
    error = record.get("prediction_error")
    row = {name: base[name] for name in ("id", "status", "source", "model", "quant", "engine", "device",
                                          "n_gpu_layers", "host_bandwidth_gbs", "engine_version", "path",
                                          "weights_bytes", "host_matmul_gflops", "quantized_matmul")}
    row.update({
        "reason": record.get("reason"),
        "arch_overrides": json.dumps(overrides, sort_keys=True) if overrides else "",
        "model_key": model_key(str(base["model"]), overrides),
        "device_count": int(base["device_count"] or 1),
        "context": int(base["context"] or 0),
        "batch": int(base["batch"] or 1),
        "kv_dtype": base["kv_dtype"] or "f16",
        "flash_attn": bool(base["flash_attn"]),
        "n_ubatch": int(base["n_ubatch"] or 512),
        "offload_fraction": float(base["offload_fraction"] or 0.0),
        "host_id": record_host_id(prov) if base["device"] == "cpu" else None,
        "host_memory_gib": host_memory / 2**30 if isinstance(host_memory, (int, float)) else None,
        "prediction_error": error.get("kind") if isinstance(error, dict) else None,
        "pred_verdict": (prediction.get("fit") or {}).get("verdict") if isinstance(prediction, dict) else None,
        "excluded_from_fit": json.dumps(base["excluded_from_fit"]) if base["excluded_from_fit"] else "",
        "source_set": source_set(record),
        "era": run_era(str(base["engine"]), base["engine_version"], base["engine_commit"]),
        "backend": record_backend(base),
        # llama-perplexity scores every prompt token: its prefill computes (and copies) every token's logits
        "logits_all": prov.get("logits_all") is True,
    })
    return {name: row[name] for name in RUN_COLUMNS}


def record_backend(base: dict[str, Any]) -> str | None:
    """The llama.cpp backend a run names (:func:`predictor.backends.find_backend` of its record's backend column or
    build kind), None for another engine or where the record names none (its device's default is taken)."""
    if base.get("engine") != "llama.cpp":
        return None
    found = find_backend(base.get("backend"))
    return found.id if found is not None else None


def exclude_reason(base: dict[str, Any], quantity: str) -> str | None:
    """Why a run's ``quantity`` is left out of fits and scores (``provenance.excluded_from_fit``), or None."""
    excluded = json.loads(base["excluded_from_fit"]) if base.get("excluded_from_fit") else {}
    return excluded.get(quantity)


def decode_row(base: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
    """The decode observation of one run, or None: seconds per step and the mean context during it."""
    decode = (record.get("measurements") or {}).get("decode") or {}
    rate = _summary_value(decode.get("decode_tok_s"))
    if rate is None:
        return None
    config = record.get("config") or {}
    start = decode.get("context_at_start")
    if start is None:
        start = min(config.get("prompt_tokens") or [DEFAULT_DECODE_PROMPT_TOKENS])
    gen = int(decode.get("gen_tokens") or config.get("gen_tokens") or 0)
    row = dict(base)
    row.update({
        "decode_tok_s": rate,
        "decode_step_s": 1.0 / rate,
        "decode_context": float(start) + gen / 2.0,
        "gen_tokens": gen,
        "rel_std": _relative_stddev(decode.get("decode_tok_s")),
        "exclude_reason": exclude_reason(base, "decode"),
    })
    return row


def prefill_rows(base: dict[str, Any], record: dict[str, Any]) -> list[dict[str, Any]]:
    """One observation per measured prompt length: prefill seconds and TTFT seconds (None if unknown)."""
    rows = []
    for point in (record.get("measurements") or {}).get("prefill") or []:
        if not isinstance(point, dict) or not point.get("prompt_tokens"):
            continue
        n = int(point["prompt_tokens"])
        rate = _summary_value(point.get("prefill_tok_s"))
        ttft_ms = _summary_value(point.get("ttft_ms"))
        if rate is None and ttft_ms is None:
            continue
        row = dict(base)
        row.update({
            "prompt_tokens": n,
            # tokens already in the cache when the prompt was processed (llama-bench @ d<depth>), which its
            # attention reads
            "prompt_depth": int(point.get("context_at_start") or 0),
            "prefill_tok_s": rate,
            "prefill_s": n / rate if rate else None,
            "ttft_s": ttft_ms / 1000.0 if ttft_ms else None,
            "rel_std": _relative_stddev(point.get("prefill_tok_s") or point.get("ttft_ms")),
            "exclude_reason": exclude_reason(base, "prefill"),
        })
        rows.append(row)
    return rows


def memory_row(base: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
    """The sampled peak memory of one run (bytes), with the engine's own breakdown when logged."""
    memory = record.get("memory") or {}
    peak = memory.get("peak_bytes")
    if not isinstance(peak, (int, float)) or peak <= 0:
        return None
    breakdown = memory.get("engine_breakdown") or {}
    row = dict(base)
    row.update({
        "peak_memory_bytes": float(peak),
        "peak_source": memory.get("peak_source"),
        "engine_weights_bytes": breakdown.get("weights_bytes"),
        "engine_kv_bytes": breakdown.get("kv_bytes"),
        "engine_compute_bytes": breakdown.get("compute_bytes"),
        "engine_non_kv_bytes": breakdown.get("non_kv_bytes"),
        "engine_node_total_bytes": breakdown.get("node_total_bytes"),
        "engine_kv_pool": (breakdown.get("vllm_options") or {}).get("kv_pool"),
        "engine_memory_utilization": (breakdown.get("vllm_options") or {}).get("gpu_memory_utilization"),
        "exclude_reason": exclude_reason(base, "memory"),
    })
    return row


def _as_dirs(runs_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None) -> list[Path]:
    if runs_dirs is None:
        return [records.runs_dir(None)]
    if isinstance(runs_dirs, (str, os.PathLike)):
        return [Path(runs_dirs)]
    return [Path(d) for d in runs_dirs]


def load_observations(runs_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
                      *, require: bool = True) -> Observations:
    """Read every record under ``runs_dirs`` (one or several directories) into :class:`Observations`.

    Only runs with status ``ok`` give observations; every run but the serving runs is in ``runs``. ``require``: raise
    BenchcalError when a directory does not exist.
    """
    runs, decode, prefill, memory = [], [], [], []
    for root in _as_dirs(runs_dirs):
        if require and not root.is_dir():
            raise BenchcalError(f"runs directory not found: {root}")
        for stored in records.iter_records(root):
            if (stored.record.get("config") or {}).get("serve"):
                continue  # a serving run (harness.serving): measured under load, not a batch-1 observation
            base = run_row(stored.path, stored.record)
            runs.append(base)
            if stored.record.get("status") != "ok":
                continue
            row = decode_row(base, stored.record)
            if row is not None:
                decode.append(row)
            prefill.extend(prefill_rows(base, stored.record))
            row = memory_row(base, stored.record)
            if row is not None:
                memory.append(row)
    return Observations(
        runs=pd.DataFrame(runs, columns=list(RUN_COLUMNS)),
        decode=pd.DataFrame(decode, columns=list(RUN_COLUMNS + DECODE_COLUMNS)),
        prefill=pd.DataFrame(prefill, columns=list(RUN_COLUMNS + PREFILL_COLUMNS)),
        memory=pd.DataFrame(memory, columns=list(RUN_COLUMNS + MEMORY_COLUMNS)),
    )
