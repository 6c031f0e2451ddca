"""The predicted vLLM KV pool against the pool vLLM logged: on a CPU for every run whose pool vLLM sized itself,
on a GPU for every vLLM log imported (:func:`gpu_kv_pool_checks`).

For each such run (``kv_pool`` profiled: "Auto set (kv/node) GiB for KV cache ... N GiB memory was consumed by non-kv
usages") the predictor's pool (:mod:`predictor.serving`: ``ceil(utilization x node memory) - weights -
vllm_cpu_worker_gib``) is computed with the run's own node memory and utilization, the predictor's weights, and the
worker figure fitted two ways: on every profiled run of the host (in-sample) and on the others only (held out; the
engine default where the host has no other).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from calibration.dataset import Dataset
from calibration.features import run_arch
from calibration.importers_vllm_log import IMPORT_FORMAT
from calibration.table import vllm_worker_rows
from harness import records
from predictor.coefficients import Coefficients
from predictor.devices import cpu_device
from predictor.engines import traits
from predictor.eras import run_era
from predictor.estimate import predict_scenario
from predictor.registry import ENGINE_DEFAULTS
from predictor.scenario import Scenario

GIB = float(2**30)


def _predicted_pool(row: Any, worker_gib: float) -> float:
    engine = str(row["engine"])
    table = Coefficients({"schema_version": 1, "engines": {engine: {"default": {
        "vllm_cpu_worker_gib": {"value": worker_gib, "identified": True}}, "families": {}, "devices": {}}}})
    node_gib = float(row["engine_node_total_bytes"]) / GIB
    bandwidth = float(row.get("host_bandwidth_gbs") or np.nan)  # the pool does not depend on it
    device = cpu_device(bandwidth_gbs=bandwidth if np.isfinite(bandwidth) and bandwidth > 0 else 10.0, tflops=None,
                        memory_gib=node_gib,
                        device_id=str(row.get("host_id") or "cpu"), memory_node_gib=node_gib)
    scenario = Scenario(model=run_arch(str(row["model"]), str(row.get("arch_overrides") or "")), device=device,
                        engine=engine, quant=str(row.get("quant") or traits(engine).default_quant),
                        context=int(row["context"]),
                        prompt_tokens=min(64, int(row["context"])),
                        gpu_memory_utilization=float(row["engine_memory_utilization"]))
    return float(predict_scenario(scenario, table, launch=False).serving["kv_pool_gib"])


def kv_pool_checks(dataset: Dataset) -> list[dict[str, Any]]:
    """One entry per profiled vLLM CPU run: the logged pool, the predicted one in-sample and held out (GiB) and
    their errors (predicted / logged - 1)."""
    out = []
    for engine in dataset.engines():
        out += _engine_checks(vllm_worker_rows(dataset, engine), engine)
    return out


def _engine_checks(rows: Any, engine: str) -> list[dict[str, Any]]:
    out = []
    for device in sorted(set(rows["device_id"])):
        group = rows[rows["device_id"] == device]
        for _, row in group.iterrows():
            logged = float(row["engine_kv_bytes"]) / GIB if row.get("engine_kv_bytes") else None
            if not logged or not np.isfinite(row.get("engine_node_total_bytes") or np.nan):
                continue
            others = group[group["id"] != row["id"]]["worker_gib"].to_numpy(dtype=float)
            held = float(np.median(others)) if len(others) else ENGINE_DEFAULTS[engine]["vllm_cpu_worker_gib"][0]
            in_sample = _predicted_pool(row, float(np.median(group["worker_gib"].to_numpy(dtype=float))))
            held_out = _predicted_pool(row, held)
            out.append({"run": row["id"], "engine": engine, "device": device, "model": row["model_key"],
                        "logged_gib": round(logged, 3), "in_sample_gib": round(in_sample, 3),
                        "held_out_gib": round(held_out, 3), "in_sample_error": round(in_sample / logged - 1.0, 4),
                        "held_out_error": round(held_out / logged - 1.0, 4),
                        "held_out_from": "the host's other profiled runs" if len(others) else "the engine default"})
    return out


# ------------------------------------------------------------------------------------------------------------ GPU

def gpu_kv_pool_checks(runs_dirs: Iterable[str | Path], coefficients: Any = "default") -> list[dict[str, Any]]:
    """The predicted vLLM KV pool on a GPU against the pool vLLM logged, one entry per imported vLLM log
    (``benchcal import vllm-log``): the run's device, model, format, context, utilization, batch budget and eager
    flag; the prediction's coefficients (``coefficients``: a table or path; none of them is fitted from a logged
    pool, so every pool is held out). Logs of vLLM's V0 engine (removed in 0.11) are listed, not scored: it sized
    its pool from a profile run of another shape."""
    out = []
    for root in runs_dirs:
        for stored in records.iter_records(root):
            record = stored.record
            provenance = record.get("provenance") or {}
            if provenance.get("import_format") != IMPORT_FORMAT or record.get("status") != "ok":
                continue
            out.append(_gpu_check(record, coefficients))
    return sorted(out, key=lambda c: (c["device"], c["model"], c["run"]))


def _gpu_check(record: dict[str, Any], coefficients: Any) -> dict[str, Any]:
    config, provenance = record["config"], record["provenance"]
    version = provenance.get("engine_version")
    breakdown = (record.get("memory") or {}).get("engine_breakdown") or {}
    logged = float(breakdown["kv_bytes"]) / GIB
    scenario = Scenario.from_config(config, prompt_tokens=min(64, int(config["context"]))).replace(
        kv_dtype=str(config.get("kv_dtype") or "bf16"),
        # predicted as the log's version sizes its pool where an era covers it, else the newest
        engine_build=version if run_era("vllm", version) else None)
    est = predict_scenario(scenario, coefficients, launch=False)
    predicted = float(est.serving["kv_pool_gib"])
    engine_generation = provenance.get("vllm_engine") or "V1"
    check = {"run": record["id"], "device": config["device"], "model": config["model"], "quant": config["quant"],
             "vllm_version": version, "vllm_engine": engine_generation,
             "source_url": provenance.get("source_url"),
             "logged_gib": round(logged, 3), "predicted_gib": round(predicted, 3),
             "error": round(predicted / logged - 1.0, 4),
             "logged_weights_gib": round(float(breakdown["weights_bytes"]) / GIB, 3),
             "predicted_weights_gib": round(float(est.values["weights_bytes"]) / GIB, 3),
             "scored": engine_generation != "V0"}
    if not check["scored"]:
        check["not_scored_because"] = "vLLM's V0 engine (removed in 0.11) profiled its pool another way"
    return check


def gpu_pool_summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """``{n, within_5_percent, median_abs_error, mean_abs_error, max_abs_error, median_error}`` over the scored
    checks."""
    errors = np.array([c["error"] for c in checks if c["scored"]], dtype=float)
    if not len(errors):
        return {"n": 0}
    return {"n": int(len(errors)), "within_5_percent": int(np.sum(np.abs(errors) <= 0.05)),
            "median_abs_error": round(float(np.median(np.abs(errors))), 4),
            "mean_abs_error": round(float(np.mean(np.abs(errors))), 4),
            "max_abs_error": round(float(np.max(np.abs(errors))), 4),
            "median_error": round(float(np.median(errors)), 4)}
