"""The accuracy gate: recompute every error with the current code and coefficients, compare with thresholds
(``calibration/accuracy.toml``) and with a committed baseline (``calibration/baseline.json``).

Errors are grouped per (engine, device); a CPU's device is its host id (``cpu-<model>-<isa>-<cores>c``). A group fails when its decode / prefill / TTFT MAPE or decode
p90 exceeds its threshold, or when its MAPE grew by more than the tolerance over the baseline; a run
fails when its peak-memory error exceeds max(``memory_rel`` x measured, ``memory_abs_mib``). The vLLM KV pools
logged on GPUs (imported logs, :func:`calibration.kvpool.gpu_kv_pool_checks`) fail when their median absolute error
exceeds ``gpu_kv_pool_median`` or one exceeds ``gpu_kv_pool_max``. With ``held_out`` (``benchcal check --held-out``),
the public results are also predicted with each source held out as a whole (the table refitted without it, as
``benchcal calibrate``'s leave-one-source-out) and fail when llama.cpp's decode or prefill MAPE exceeds
``held_out_decode_mape`` / ``held_out_prefill_mape``, or vLLM's batch-1 decode (its public results are GPUs')
``held_out_vllm_decode_mape``: accuracy where nobody measured, not only in-sample.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from calibration.crossval import quantity_ape, scored_rows, summarize_errors
from calibration.dataset import Dataset, measured, predict
from predictor.coefficients import Coefficients
from predictor.errors import BenchcalError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_THRESHOLDS = {"decode_mape": 0.10, "decode_p90": 0.20, "prefill_mape": 0.15, "ttft_mape": 0.15,
                      "memory_rel": 0.03, "memory_abs_mib": 256.0, "gpu_kv_pool_median": 0.10,
                      "gpu_kv_pool_max": 0.40, "held_out_decode_mape": 0.10, "held_out_prefill_mape": 0.15,
                      "held_out_vllm_decode_mape": 0.15}
DEFAULT_TOLERANCE = {"mape_increase": 0.02}
MIB = float(2**20)
QUANTITIES = ("decode", "prefill", "ttft")


@dataclass
class Thresholds:
    """Limits per metric, with per-group overrides ("engine/device" -> {metric: limit})."""

    limits: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    tolerance: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TOLERANCE))
    overrides: dict[str, dict[str, float]] = field(default_factory=dict)

    def limit(self, group: str, metric: str) -> float:
        """The group's own limit, else (a CPU host, ``engine/cpu-...``) the ``engine/cpu`` one, else the default."""
        engine, _sep, device = group.partition("/")
        for key in (group, f"{engine}/cpu" if device.startswith("cpu-") else None):
            if key and metric in self.overrides.get(key, {}):
                return float(self.overrides[key][metric])
        return float(self.limits[metric])


def load_thresholds(path: str | Path | None) -> Thresholds:
    """Read the thresholds TOML ([thresholds], [tolerance], [overrides."engine/device"]); None: defaults."""
    if path is None:
        return Thresholds()
    p = Path(path)
    if not p.is_file():
        raise BenchcalError(f"thresholds file not found: {p}")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BenchcalError(f"thresholds file {p} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise BenchcalError(f"thresholds file {p} is not a text file (not UTF-8)") from None
    limits = dict(DEFAULT_THRESHOLDS)
    limits.update({k: float(v) for k, v in (data.get("thresholds") or {}).items()})
    tolerance = dict(DEFAULT_TOLERANCE)
    tolerance.update({k: float(v) for k, v in (data.get("tolerance") or {}).items()})
    overrides = {str(g): {k: float(v) for k, v in vals.items()} for g, vals in (data.get("overrides") or {}).items()}
    unknown = {k for vals in overrides.values() for k in vals} - set(DEFAULT_THRESHOLDS)
    if unknown:
        raise BenchcalError(f"thresholds file {p}: unknown metric(s) {', '.join(sorted(unknown))}")
    return Thresholds(limits, tolerance, overrides)


def group_metrics(dataset: Dataset, predictions: dict[str, np.ndarray],
                  include_noisy: bool = False) -> dict[str, dict[str, Any]]:
    """{"engine/device": {"decode": {mape, p90, n}, "prefill": ..., "ttft": ..., "memory": {...}}}."""
    actual = measured(dataset)
    out: dict[str, dict[str, Any]] = {}
    for q in QUANTITIES + ("memory",):
        block = dataset.blocks["prefill" if q == "ttft" else q]
        if len(block) == 0:
            continue
        errors = np.where(scored_rows(dataset, q, include_noisy), quantity_ape(q, predictions[q], actual[q]), np.nan)
        # a record without a device id (an import the catalogue does not place) is grouped as "unknown"
        devices = block.meta["device_id"].where(block.meta["device_id"].notna(), "unknown").astype(str)
        groups = (block.meta["engine"].astype(str) + "/" + devices).to_numpy()
        for group in sorted(set(groups)):
            stats = summarize_errors(errors[groups == group])
            if stats["n"]:
                out.setdefault(group, {})[q] = stats
    return out


def memory_failures(dataset: Dataset, predictions: dict[str, np.ndarray], thresholds: Thresholds) -> list[dict]:
    """Runs whose peak-memory error exceeds max(memory_rel x measured, memory_abs_mib)."""
    block = dataset.blocks["memory"]
    failures = []
    for i, meta in enumerate(block.meta.to_dict("records")):
        meas, pred = block.y[i], predictions["memory"][i]
        if not (np.isfinite(meas) and np.isfinite(pred)):
            continue
        group = f"{meta['engine']}/{meta['device_id']}"
        allowed = max(thresholds.limit(group, "memory_rel") * meas, thresholds.limit(group, "memory_abs_mib") * MIB)
        if abs(pred - meas) > allowed:
            failures.append({"group": group, "id": meta["id"], "model": meta["model_key"], "quant": meta["quant"],
                             "context": meta["context"], "measured_mib": round(meas / MIB, 1),
                             "predicted_mib": round(pred / MIB, 1), "allowed_mib": round(allowed / MIB, 1)})
    return failures


@dataclass
class CheckResult:
    """Metrics, failures (threshold and regression) and notes of one check."""

    metrics: dict[str, dict[str, Any]]
    failures: list[str]
    notes: list[str]
    gpu_kv_pool: dict[str, Any] | None = None  # summary of the GPU KV-pool checks, when there are logs
    held_out: dict[str, Any] | None = None  # leave-one-source-out MAPE of the public results, when asked for

    @property
    def ok(self) -> bool:
        return not self.failures


def run_check(dataset: Dataset, table: Coefficients, thresholds: Thresholds,
              baseline: dict[str, Any] | None = None, include_noisy: bool = False,
              gpu_pools: list[dict[str, Any]] | None = None, held_out: bool = False) -> CheckResult:
    """Compare recomputed errors with thresholds and, when given, the baseline.

    ``include_noisy``: also score measurements whose repetitions spread more than 5% (left out by default).
    ``gpu_pools``: :func:`calibration.kvpool.gpu_kv_pool_checks` of the runs, gated as a whole.
    ``held_out``: also gate the public results held out by source (:func:`held_out_gate`; a refit per source).
    """
    predictions = predict(dataset, table)
    metrics = group_metrics(dataset, predictions, include_noisy)
    failures, notes = [], []
    if not include_noisy:
        for q, block in dataset.blocks.items():
            noisy = int((block.noisy & block.features.valid).sum())
            if noisy:
                notes.append(f"{noisy} {q} measurement(s) left out: repetitions spread more than 5% "
                             "(--include-noisy scores them)")
    for group, by_q in metrics.items():
        for q in QUANTITIES:
            stats = by_q.get(q)
            if not stats:
                continue
            limit = thresholds.limit(group, f"{q}_mape")
            if stats["mape"] > limit:
                failures.append(f"{group} {q}: MAPE {100 * stats['mape']:.1f}% > {100 * limit:.1f}% (n={stats['n']})")
            if q == "decode" and stats["p90"] > thresholds.limit(group, "decode_p90"):
                failures.append(f"{group} decode: p90 {100 * stats['p90']:.1f}% > "
                                f"{100 * thresholds.limit(group, 'decode_p90'):.1f}% (n={stats['n']})")
    for f in memory_failures(dataset, predictions, thresholds):
        failures.append(f"{f['group']} memory: run {f['id']} ({f['model']} {f['quant']} ctx {f['context']}) "
                        f"predicted {f['predicted_mib']} MiB, measured {f['measured_mib']} MiB, "
                        f"allowed ±{f['allowed_mib']} MiB")
    if baseline:
        tol = thresholds.tolerance["mape_increase"]
        base_groups = baseline.get("groups") or {}
        for group, by_q in metrics.items():
            for q, stats in by_q.items():
                before = ((base_groups.get(group) or {}).get(q) or {}).get("mape")
                if before is None:
                    continue
                if stats["mape"] > before + tol:
                    failures.append(f"{group} {q}: MAPE {100 * stats['mape']:.1f}% worse than baseline "
                                    f"{100 * before:.1f}% by more than {100 * tol:.1f} points")
        missing = sorted(set(base_groups) - set(metrics))
        if missing:
            notes.append(f"in the baseline but not measured now: {', '.join(missing)}")
    pools = _gpu_pool_gate(gpu_pools or [], thresholds, failures)
    held = held_out_gate(dataset, thresholds, failures) if held_out else None
    return CheckResult(metrics, failures, notes, pools, held)


def held_out_gate(dataset: Dataset, thresholds: Thresholds, failures: list[str]) -> dict[str, Any]:
    """The imported public results predicted with each source held out (:func:`calibration.crossval.
    leave_one_source_out`), pooled per engine: ``{key: {engine, quantity, mape, p90, n, limit, folds, worst_ratio,
    beyond_2x, left_out}}`` (:func:`calibration.crossval.held_out_folds`: each source's fold, the worst row, the rows
    the score leaves out and why; beside them the folds by backend and by architecture class). An engine's limit is
    ``held_out_<engine>_<quantity>_mape`` where the thresholds name one (vLLM's decode, all of it on GPUs), else
    ``held_out_<quantity>_mape`` (llama.cpp's); its key is the quantity for the latter and ``<engine> <quantity>``
    for the former. A failure is appended where a pooled MAPE exceeds its limit (the folds are printed, not gated)."""
    from calibration.crossval import (
        derive_column,
        error_metrics,
        held_out_folds,
        leave_one_backend_out,
        leave_one_class_out,
        leave_one_source_out,
    )

    predictions = leave_one_source_out(dataset)
    by_column = {column: how(dataset) for how, column in ((leave_one_backend_out, "backend_resolved"),
                                                          (leave_one_class_out, "arch_class"))}
    derive_column(dataset, "depth_class")
    out: dict[str, Any] = {}
    for engine in dataset.engines():
        mine = _only(dataset, predictions, engine)
        imported = (error_metrics(dataset, mine).get("origins") or {}).get("imported") or {}
        folds = held_out_folds(dataset, mine)
        # beside: each backend, and dense / MoE, held out as a whole (printed, not gated)
        others = {name: held_out_folds(dataset, _only(dataset, by_column[column], engine), column=column)
                  for name, column in (("backend", "backend_resolved"), ("class", "arch_class"))}
        # beside too: the by-source predictions of prompts after cached tokens apart from those from an empty cache
        others["source, by cache depth"] = held_out_folds(dataset, mine, ("prefill",), column="depth_class")
        for q in ("decode", "prefill"):
            stats = imported.get(q) or {}
            if not stats.get("n"):
                continue
            own = f"held_out_{engine.replace('.', '')}_{q}_mape"
            limit = thresholds.limits.get(own, thresholds.limits[f"held_out_{q}_mape"])
            key = f"{engine} {q}" if own in thresholds.limits else q
            by = {name: {"folds": found[q]["folds"], "worst_ratio": found[q]["worst_ratio"],
                         "beyond_2x": found[q]["beyond_2x"]} for name, found in others.items()
                  if q in found and any(f["n"] for f in found[q]["folds"].values())}
            out[key] = {"engine": engine, "quantity": q, "mape": stats["mape"], "p90": stats["p90"], "n": stats["n"],
                        "limit": limit, **folds[q], "by": by}
            if stats["mape"] > limit:
                failures.append(f"{engine} public results held out by source, {q}: MAPE {100 * stats['mape']:.1f}% > "
                                f"{100 * limit:.1f}% (n={stats['n']})")
    return out


def _only(dataset: Dataset, predictions: dict[str, np.ndarray], engine: str) -> dict[str, np.ndarray]:
    """``predictions`` with every row of another engine NaN."""
    return {q: np.where(dataset.blocks["prefill" if q == "ttft" else q].meta["engine"].to_numpy() == engine,
                        values, np.nan) for q, values in predictions.items()}


def _gpu_pool_gate(checks: list[dict[str, Any]], thresholds: Thresholds, failures: list[str]) -> dict[str, Any] | None:
    from calibration.kvpool import gpu_pool_summary

    summary = gpu_pool_summary(checks)
    if not summary["n"]:
        return None
    median, worst = thresholds.limits["gpu_kv_pool_median"], thresholds.limits["gpu_kv_pool_max"]
    if summary["median_abs_error"] > median:
        failures.append(f"vllm GPU KV pool: median |error| {100 * summary['median_abs_error']:.1f}% > "
                        f"{100 * median:.1f}% (n={summary['n']})")
    for check in checks:
        if check["scored"] and abs(check["error"]) > worst:
            failures.append(f"vllm GPU KV pool: {check['device']} {check['model']} (run {check['run']}) predicted "
                            f"{check['predicted_gib']:.2f} GiB, logged {check['logged_gib']:.2f} GiB "
                            f"({100 * check['error']:+.1f}% beyond ±{100 * worst:.0f}%)")
    return summary


def load_baseline(path: str | Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchcalError(f"baseline {p} is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise BenchcalError(f"baseline {p} is not a text file (not UTF-8)") from None


def baseline_document(result: CheckResult, coefficients_source: str, runs_dirs: list[str]) -> dict[str, Any]:
    return {"schema": "benchcal.baseline/1",
            "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "coefficients": coefficients_source, "runs_dirs": runs_dirs, "groups": result.metrics}


def _fold_lines(quantity: str, stats: dict[str, Any]) -> list[str]:
    """The held-out folds of one quantity, worst first, its worst row and what the score leaves out."""
    folds = sorted((stats.get("folds") or {}).items(), key=lambda kv: -(kv[1]["mape"] or 0.0))
    lines = [f"    {quantity} fold {name}: {100 * f['mape']:.1f}% (n={f['n']})" for name, f in folds if f["n"]]
    if stats.get("worst_ratio") is not None:
        lines.append(f"    {quantity} worst row {stats['worst_ratio']:.2f}x off; {stats['beyond_2x']} row(s) more than 2x off")
    for name, found in (stats.get("by") or {}).items():
        parts = [f"{fold} {100 * f['mape']:.1f}% (n={f['n']})" for fold, f in
                 sorted(found["folds"].items(), key=lambda kv: -(kv[1]["mape"] or 0.0)) if f["n"]]
        if parts:
            worst = f"; worst row {found['worst_ratio']:.2f}x" if found.get("worst_ratio") is not None else ""
            lines.append(f"    {quantity} held out by {name}: " + ", ".join(parts) + worst)
    left = stats.get("left_out") or {}
    if left:
        lines.append(f"    {quantity} rows left out of the score: {sum(left.values())} ("
                     + "; ".join(f"{reason}: {n}" for reason, n in left.items()) + ")")
    return lines


def summary_lines(result: CheckResult) -> list[str]:
    """One line per group: MAPE per quantity."""
    lines = []
    for group in sorted(result.metrics):
        parts = []
        for q in ("decode", "prefill", "ttft", "memory"):
            stats = result.metrics[group].get(q)
            if stats:
                parts.append(f"{q} {100 * stats['mape']:.1f}% (p90 {100 * stats['p90']:.1f}%, n={stats['n']})")
        lines.append(f"  {group}: " + "; ".join(parts))
    for stats in (result.held_out or {}).values():
        q = stats["quantity"]
        lines.append(f"  {stats['engine']} public results held out by source: {q} {100 * stats['mape']:.1f}% (p90 "
                     f"{100 * stats['p90']:.1f}%, n={stats['n']}; limit {100 * stats['limit']:.0f}%)")
        lines += _fold_lines(q, stats)
    pools = result.gpu_kv_pool
    if pools:
        lines.append(f"  vllm GPU KV pool (imported logs, none fitted): median |error| "
                     f"{100 * pools['median_abs_error']:.1f}%, max {100 * pools['max_abs_error']:.1f}%, within 5%: "
                     f"{pools.get('within_5_percent', 0)} of {pools['n']}")
    return lines
