"""Run records as pandas tables: one flat row per run, or per (run, prompt length).

The loaders behind ``benchcal runs`` and the bench summary. Like :mod:`harness.records` they import no
engine; calibration flattens records its own way (:mod:`calibration.observations`) for the fits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import records

RUN_COLUMNS = (
    "id", "status", "reason", "model", "quant", "engine", "device", "device_count", "context", "batch",
    "kv_dtype", "weights", "n_gpu_layers", "flash_attn", "n_ubatch", "offload_fraction", "gen_tokens",
    "prompt_tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s", "decode_tok_s_std", "load_s",
    "peak_memory_bytes", "peak_memory_source", "engine_weights_bytes", "engine_kv_bytes",
    "engine_compute_bytes", "engine_total_bytes", "pred_verdict", "pred_memory_total_gib",
    "pred_decode_tok_s", "pred_prefill_tok_s", "pred_ttft_ms", "source", "engine_version", "device_name",
    "host_bandwidth_gbs", "device_bandwidth_gbs", "started_at", "path",
    "config_hash", "prediction_error", "threads", "n_batch",
)

PREFILL_COLUMNS = (
    "id", "status", "model", "quant", "engine", "device", "device_count", "context", "batch", "kv_dtype",
    "weights", "n_gpu_layers", "flash_attn", "n_ubatch", "offload_fraction", "prompt_tokens", "ttft_ms",
    "ttft_ms_std", "prefill_tok_s", "prefill_tok_s_std", "n", "source", "engine_version", "device_name",
    "host_bandwidth_gbs", "device_bandwidth_gbs", "started_at", "path",
)


def _median(summary: Any) -> float | None:
    return summary.get("median") if isinstance(summary, dict) else None


def _stddev(summary: Any) -> float | None:
    return summary.get("stddev") if isinstance(summary, dict) else None


def _dig(mapping: Any, *paths: str) -> Any:
    """First non-None value found at any dotted path in ``mapping``."""
    for path in paths:
        node = mapping
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def prediction_columns(prediction: Any) -> dict[str, Any]:
    """Flatten the predictor's ``Estimate.to_dict()`` into the ``pred_*`` columns (missing keys give None)."""
    memory_gib = _dig(prediction, "memory.total_gib", "memory_total_gib", "fit.required_gib")
    if memory_gib is None:
        total_bytes = _dig(prediction, "memory.total_bytes", "memory_total_bytes", "fit.required_bytes")
        memory_gib = total_bytes / 2**30 if isinstance(total_bytes, (int, float)) else None
    return {
        "pred_verdict": _dig(prediction, "fit.verdict", "verdict"),
        "pred_memory_total_gib": memory_gib,
        "pred_decode_tok_s": _dig(prediction, "throughput.decode_tok_s", "decode_tok_s", "decode.tok_s"),
        "pred_prefill_tok_s": _dig(prediction, "throughput.prefill_tok_s", "prefill_tok_s", "prefill.tok_s"),
        "pred_ttft_ms": _dig(prediction, "throughput.ttft_ms", "ttft_ms", "prefill.ttft_ms"),
    }


def common_columns(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """A run's identity and configuration, flat, values as the record holds them (no defaults filled in): the one
    flattening of a record, which ``benchcal runs`` (:func:`run_row`) and the calibration
    (:func:`calibration.observations.run_row`, which fills in the defaults the fits assume) both build on."""
    config = record.get("config") or {}
    options = config.get("engine_options") or {}
    provenance = record.get("provenance") or {}
    return {
        "id": record.get("id"),
        "status": record.get("status"),
        "model": config.get("model"),
        "quant": config.get("quant"),
        "engine": config.get("engine"),
        "device": config.get("device"),
        "device_count": config.get("device_count"),
        "context": config.get("context"),
        "batch": config.get("batch"),
        "kv_dtype": config.get("kv_dtype"),
        "weights": config.get("weights"),
        "n_gpu_layers": options.get("n_gpu_layers"),
        "flash_attn": options.get("flash_attn"),
        "n_ubatch": options.get("n_ubatch"),
        "offload_fraction": config.get("offload_fraction"),
        "source": provenance.get("source"),
        "engine_version": provenance.get("engine_version"),
        "device_name": provenance.get("device_name"),
        "host_bandwidth_gbs": provenance.get("host_bandwidth_gbs"),
        "device_bandwidth_gbs": provenance.get("device_bandwidth_gbs"),
        "started_at": provenance.get("started_at"),
        "path": str(path),
        # what the fits read beside the columns above (calibration.observations)
        "arch_overrides": dict(config.get("arch_overrides") or {}),
        "weights_bytes": provenance.get("weights_bytes") or provenance.get("model_size_bytes"),
        "host_matmul_gflops": provenance.get("host_matmul_gflops"),
        "host_memory_bytes": provenance.get("host_memory_bytes"),
        "quantized_matmul": provenance.get("quantized_matmul"),
        "engine_commit": provenance.get("engine_commit"),
        "excluded_from_fit": provenance.get("excluded_from_fit"),
        # llama.cpp's backend as the record names it: llama-bench's backend column (imports), else the build's kind
        "backend": provenance.get("backend") or provenance.get("backends") or provenance.get("engine_build"),
    }


def run_row(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """One flat row (see ``RUN_COLUMNS``) for a stored record."""
    row = common_columns(path, record)
    config = record.get("config") or {}
    options = config.get("engine_options") or {}
    measurements = record.get("measurements") or {}
    memory = record.get("memory") or {}
    breakdown = memory.get("engine_breakdown") or {}
    prefill = [p for p in measurements.get("prefill") or [] if isinstance(p, dict)]
    largest = max(prefill, key=lambda p: p.get("prompt_tokens") or 0) if prefill else {}
    decode = measurements.get("decode") or {}
    row.update({
        "reason": record.get("reason"),
        "gen_tokens": config.get("gen_tokens"),
        "prompt_tokens": largest.get("prompt_tokens"),
        "ttft_ms": _median(largest.get("ttft_ms")),
        "prefill_tok_s": _median(largest.get("prefill_tok_s")),
        "decode_tok_s": _median(decode.get("decode_tok_s")),
        "decode_tok_s_std": _stddev(decode.get("decode_tok_s")),
        "load_s": measurements.get("load_s"),
        "peak_memory_bytes": memory.get("peak_bytes"),
        "peak_memory_source": memory.get("peak_source"),
        "engine_weights_bytes": breakdown.get("weights_bytes"),
        "engine_kv_bytes": breakdown.get("kv_bytes"),
        "engine_compute_bytes": breakdown.get("compute_bytes"),
        "engine_total_bytes": breakdown.get("total_bytes"),
        "config_hash": record.get("config_hash"),
        "prediction_error": bool(record.get("prediction_error")),
        "threads": options.get("threads"),
        "n_batch": options.get("n_batch"),
    })
    row.update(prediction_columns(record.get("prediction")))
    return row


def prefill_rows(path: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per measured prompt length (see ``PREFILL_COLUMNS``) for a stored record."""
    base = common_columns(path, record)
    rows = []
    for point in (record.get("measurements") or {}).get("prefill") or []:
        if not isinstance(point, dict):
            continue
        ttft = point.get("ttft_ms")
        rate = point.get("prefill_tok_s")
        row = dict(base)
        row.update({
            "prompt_tokens": point.get("prompt_tokens"),
            "ttft_ms": _median(ttft),
            "ttft_ms_std": _stddev(ttft),
            "prefill_tok_s": _median(rate),
            "prefill_tok_s_std": _stddev(rate),
            "n": rate.get("n") if isinstance(rate, dict) else None,
        })
        rows.append(row)
    return rows


def load_runs(runs_dir: str | os.PathLike[str] | None = None,
              on_error: Callable[[Path, str], None] | None = None) -> Any:
    """A pandas DataFrame with one row per stored run and the flat columns of ``RUN_COLUMNS``."""
    import pandas as pd

    root = records.runs_dir(runs_dir)
    rows = [run_row(run.path, run.record) for run in records.iter_records(root, on_error=on_error)]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def load_prefill_points(runs_dir: str | os.PathLike[str] | None = None,
                        on_error: Callable[[Path, str], None] | None = None) -> Any:
    """A pandas DataFrame with one row per (run, prompt length) and the columns of ``PREFILL_COLUMNS``."""
    import pandas as pd

    root = records.runs_dir(runs_dir)
    rows: list[dict[str, Any]] = []
    for run in records.iter_records(root, on_error=on_error):
        rows.extend(prefill_rows(run.path, run.record))
    return pd.DataFrame(rows, columns=list(PREFILL_COLUMNS))
