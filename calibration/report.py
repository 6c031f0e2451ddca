"""Measured vs predicted: every measured configuration against the predictor with its engine defaults and
with a calibrated coefficient table, errors, summaries per engine and device, failed runs and fit-verdict
errors. Built as a :class:`predictor.render.Report` (table, md, json, html with charts).

Predictions here come from :func:`predictor.estimate.evaluate` itself, with each run's coefficients
looked up the way ``benchcal predict`` looks them up, so an error in this report is the error a user of
``predict`` would see for that configuration (decode at the run's mean context, prefill at its prompt).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from calibration.crossval import ape, summarize_errors
from calibration.dataset import Block, Dataset, row_coefficient_sets
from calibration.features import evaluate_rows, frame_inputs
from predictor.coefficients import COEFFICIENT_NAMES, Coefficients
from predictor.estimate import VERDICTS
from predictor.render import Chart, Report

GIB = float(2**30)
QUANTITY_LABELS = {"decode": "decode tok/s", "prefill": "prefill tok/s", "ttft": "TTFT ms", "memory": "peak GiB"}


def _coefficient_arrays(meta: pd.DataFrame, table: Coefficients) -> dict[str, np.ndarray]:
    sets = row_coefficient_sets(meta, table)
    return {name: np.asarray([s[name] if s is not None else np.nan for s in sets], dtype=float)
            for name in COEFFICIENT_NAMES}


def block_predictions(block: Block, table: Coefficients) -> dict[str, np.ndarray]:
    """evaluate() outputs for a block's rows with ``table``'s coefficients."""
    if len(block) == 0:
        return {"decode_step_s": np.zeros(0), "prefill_s": np.zeros(0), "total_bytes": np.zeros(0)}
    prompts = {"decode": "decode_context", "prefill": "prompt_tokens"}.get(block.quantity)
    prompt = block.meta[prompts].to_numpy(dtype=float) if prompts else np.ones(len(block))
    return evaluate_rows(block.inputs, _coefficient_arrays(block.meta, table), prompt)


def run_verdicts(runs: pd.DataFrame, table: Coefficients) -> tuple[list[str | None], np.ndarray]:
    """Fit verdict and predicted total bytes for every run (failed ones included)."""
    if len(runs) == 0:
        return [], np.zeros(0)
    frame = runs.reset_index(drop=True)
    inputs = frame_inputs(frame)
    meta = frame.assign(device_id=[s["device_id"] if s else None for s in inputs.rows],
                        family=[s["family"] if s else None for s in inputs.rows])
    out = evaluate_rows(inputs, _coefficient_arrays(meta, table), frame["context"].to_numpy(dtype=float),
                        ("verdict", "total_bytes"))
    verdicts = [VERDICTS[int(v)] if np.isfinite(v) else None for v in out["verdict"]]
    return verdicts, out["total_bytes"]


def _round(x: float, nd: int = 2) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _err(pred: float, meas: float) -> str:
    if not (np.isfinite(pred) and np.isfinite(meas)) or meas == 0:
        return "—"
    return f"{100 * (pred / meas - 1):+.1f}%"


def comparison_rows(dataset: Dataset, default: Coefficients, calibrated: Coefficients) -> dict[str, list[dict]]:
    """Per quantity, one dict per observation: config, measured, predicted (default, calibrated)."""
    out: dict[str, list[dict]] = {}
    for quantity, block in dataset.blocks.items():
        pd_default = block_predictions(block, default)
        pd_cal = block_predictions(block, calibrated)
        rows = []
        for i, meta in enumerate(block.meta.to_dict("records")):
            base = {k: meta.get(k) for k in ("id", "engine", "device", "model_key", "quant", "context", "source")}
            batch = int(meta.get("batch") or 1)
            base["excluded"] = (f"excluded: {meta['exclude_reason']}" if block.excluded[i] else
                                "noisy" if block.noisy[i] else
                                f"batch {batch}" if quantity != "memory" and batch != 1 else None)
            base["group"] = f"{meta['engine']}/{meta['device']}"
            if quantity == "decode":
                meas = 1.0 / block.y[i]
                base.update(point=f"ctx {meta['decode_context']:.0f}", measured=meas,
                            default=1.0 / pd_default["decode_step_s"][i], calibrated=1.0 / pd_cal["decode_step_s"][i])
                rows.append(base)
            elif quantity == "prefill":
                n = float(meta["prompt_tokens"])
                point = dict(base, point=f"{n:.0f} tokens")
                if np.isfinite(block.y[i]):
                    rows.append(dict(point, quantity="prefill", measured=n / block.y[i],
                                     default=n / pd_default["prefill_s"][i], calibrated=n / pd_cal["prefill_s"][i]))
                ttft = meta.get("ttft_s")
                if ttft is not None and np.isfinite(ttft):
                    out.setdefault("ttft", []).append(dict(point, measured=1000 * ttft,
                                                           default=1000 * pd_default["prefill_s"][i],
                                                           calibrated=1000 * pd_cal["prefill_s"][i]))
            else:
                rows.append(dict(base, point=f"ctx {meta['context']}", measured=block.y[i] / GIB,
                                 default=pd_default["total_bytes"][i] / GIB,
                                 calibrated=pd_cal["total_bytes"][i] / GIB))
        out[quantity] = rows
    out.setdefault("ttft", [])
    return out


def _summary(rows_by_q: dict[str, list[dict]], key: str) -> list[list[Any]]:
    """MAPE (default -> calibrated) per quantity for each value of ``key`` (engine or device)."""
    groups = sorted({str(r[key]) for rows in rows_by_q.values() for r in rows})
    table = []
    for group in groups:
        cells: list[Any] = [group]
        for q in ("decode", "prefill", "ttft", "memory"):
            rows = [r for r in rows_by_q.get(q, []) if str(r[key]) == group and not r["excluded"]]
            if not rows:
                cells.append("—")
                continue
            meas = np.array([r["measured"] for r in rows], float)
            d = summarize_errors(ape(np.array([r["default"] for r in rows], float), meas))
            c = summarize_errors(ape(np.array([r["calibrated"] for r in rows], float), meas))
            cells.append(f"{_pct(d['mape'])} → {_pct(c['mape'])} (n={c['n']})")
        table.append(cells)
    return table


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _charts(rows_by_q: dict[str, list[dict]]) -> list[Chart]:
    charts = []
    decode = [r for r in rows_by_q.get("decode", []) if np.isfinite(r["calibrated"])]
    if decode:
        series = {
            "calibrated": ([r["measured"] for r in decode], [r["calibrated"] for r in decode]),
            "engine defaults": ([r["measured"] for r in decode], [r["default"] for r in decode]),
        }
        charts.append(Chart("Decode: measured vs predicted", "measured tok/s", "predicted tok/s", series,
                            kind="scatter", diagonal=True))
        by_device: dict[str, tuple[list[float], list[float]]] = {}
        for r in decode:
            xs, ys = by_device.setdefault(str(r["device"]), ([], []))
            xs.append(r["measured"])
            ys.append(100 * (r["calibrated"] / r["measured"] - 1))
        charts.append(Chart("Decode error by device (calibrated)", "measured tok/s", "error %", by_device,
                            kind="scatter", hline=0.0))
    for q, label in (("prefill", "prefill tok/s"), ("memory", "peak GiB")):
        rows = [r for r in rows_by_q.get(q, []) if np.isfinite(r["calibrated"])]
        if rows:
            charts.append(Chart(f"{q.capitalize()}: measured vs predicted", f"measured {label}",
                                f"predicted {label}",
                                {"calibrated": ([r["measured"] for r in rows], [r["calibrated"] for r in rows]),
                                 "engine defaults": ([r["measured"] for r in rows], [r["default"] for r in rows])},
                                kind="scatter", diagonal=True))
    return charts


def build_report(dataset: Dataset, calibrated: Coefficients, *, title: str = "benchcal: measured vs predicted",
                 charts: bool = True) -> Report:
    """The measured-vs-predicted report for every run in ``dataset``."""
    default = Coefficients()
    rows_by_q = comparison_rows(dataset, default, calibrated)
    runs = dataset.observations.runs
    rep = Report(title=title, subtitle=(
        f"{len(runs)} runs ({int((runs['status'] == 'ok').sum()) if len(runs) else 0} ok); calibrated "
        f"coefficients: {calibrated.source}. Errors are predicted / measured - 1; summaries are MAPE "
        "with engine defaults → with the calibrated table. Noisy points (repetitions spread > 5%), points "
        "a record excludes from fits (with its reason) and times measured under concurrent load (batch > 1) "
        "are shown but left out of summaries."))
    rep.add("Summary by engine", "table", _summary(rows_by_q, "engine"),
            ["engine", "decode", "prefill", "TTFT", "peak memory"])
    rep.add("Summary by engine and device", "table", _summary(rows_by_q, "group"),
            ["engine/device", "decode", "prefill", "TTFT", "peak memory"])
    for q in ("decode", "prefill", "ttft", "memory"):
        rows = rows_by_q.get(q, [])
        if not rows:
            continue
        rep.add(f"{QUANTITY_LABELS[q]}: measured vs predicted", "table", [
            [r["engine"], r["device"], r["model_key"], r["quant"], r["point"], _round(r["measured"]),
             _round(r["default"]), _err(r["default"], r["measured"]), _round(r["calibrated"]),
             _err(r["calibrated"], r["measured"]) + (f" ({r['excluded']})" if r["excluded"] else "")]
            for r in rows
        ], ["engine", "device", "model", "quant", "at", "measured", "default", "error", "calibrated", "error"])
    verdicts, _totals = run_verdicts(runs, calibrated)
    failed = [r for r in runs.to_dict("records") if r["status"] != "ok"]
    if failed:
        rep.add("Failed runs", "table", [[r["id"], r["engine"], r["device"], r["model_key"], r["quant"], r["context"],
                                          r["status"], (r["reason"] or "")[:120]] for r in failed],
                ["run", "engine", "device", "model", "quant", "context", "status", "reason"])
    wrong = []
    for r, verdict in zip(runs.to_dict("records"), verdicts, strict=True):
        if (r["status"] == "oom" and verdict in ("fits", "tight")) or (r["status"] == "ok" and verdict == "does not fit"):
            wrong.append([r["id"], r["device"], r["model_key"], r["quant"], r["context"], r["status"], verdict,
                          r.get("prediction_error") or "—"])
    rep.add("Fit-verdict errors", "table", wrong or [["none", "", "", "", "", "", "", ""]],
            ["run", "device", "model", "quant", "context", "measured", "predicted now", "flagged at run time"],
            note="An OOM the calibrated predictor says fits, or an ok run it says does not fit.")
    rep.data = {"schema": "benchcal.report/1", "coefficients": calibrated.source,
                "rows": {q: [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
                             for r in rows] for q, rows in rows_by_q.items()},
                "failed_runs": [{k: r[k] for k in ("id", "status", "reason", "device", "model_key")} for r in failed],
                "fit_verdict_errors": [dict(zip(("id", "device", "model", "quant", "context", "status", "verdict",
                                                 "flagged"), w, strict=True)) for w in wrong]}
    if charts:
        rep.charts = _charts(rows_by_q)
    return rep
