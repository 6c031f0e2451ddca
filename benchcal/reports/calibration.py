"""``benchcal report``: measured vs predicted for every run (:mod:`calibration.comparison`), with errors,
summaries per engine and device, failed runs and fit-verdict errors, as a :class:`benchcal.reports.render.Report`
(table, md, json, html with charts)."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchcal.reports.render import Chart, Report
from calibration.comparison import comparison_rows, run_verdicts
from calibration.crossval import ape, summarize_errors
from calibration.dataset import Dataset
from predictor.coefficients import Coefficients

QUANTITY_LABELS = {"decode": "decode tok/s", "prefill": "prefill tok/s", "ttft": "TTFT ms", "memory": "peak GiB"}


def _round(x: float, nd: int = 2) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _err(pred: float, meas: float) -> str:
    if not (np.isfinite(pred) and np.isfinite(meas)) or meas == 0:
        return "—"
    return f"{100 * (pred / meas - 1):+.1f}%"


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


def _pct_or_dash(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1%}"


def add_serving_section(rep: Report, runs_dirs, table: Coefficients, charts: bool = True) -> None:
    """Serving runs (``benchcal bench --serve``): each level measured against the serving model fitted on these runs
    (:func:`calibration.serving.fit_serving`; in-sample, the highest concurrency held out, and request rates, which
    no fit sees), and, with ``charts``, throughput and TTFT against the requests in flight, measured and
    predicted. Nothing is added when no serving run was measured."""
    from calibration.serving import fit_serving

    fits = fit_serving(list(runs_dirs), table)
    rows, data = [], []
    for engine, devices in fits.items():
        for device, fit in devices.items():
            rated = bool(fit.get("request_rates_fitted"))  # fitted on request rates: no concurrency level
            for label, checks in (("in-sample", fit["in_sample"]), ("held out", fit["held_out"]),
                                  ("in-sample" if rated else "never fitted", fit["request_rates"]),
                                  ("held out", fit.get("request_rates_held_out", []))):
                for c in checks:
                    load = (f"concurrency {c['concurrency']}" if "concurrency" in c
                            else f"{c['request_rate']:g} requests/s")
                    out, ttft = c["output_tok_s"], c["ttft_p50_ms"]
                    rows.append([engine, device, label, load, _round(out["measured"], 1), _round(out["predicted"], 1),
                                 _pct_or_dash(out["error"]), _round(ttft["measured"], 1),
                                 _round(ttft["predicted"], 1), _pct_or_dash(ttft["error"])])
                    data.append({"engine": engine, "device": device, "check": label, **c})
            if charts and fit["in_sample"]:
                points = sorted(fit["in_sample"], key=lambda c: c["concurrency"])
                xs = [c["concurrency"] for c in points]
                name = f"{engine} on {device}"
                rep.charts.append(Chart(f"Serving: output tokens/s vs requests in flight — {name}",
                                        "requests in flight", "output tok/s", {
                                            "measured": (xs, [c["output_tok_s"]["measured"] for c in points]),
                                            "predicted (fitted on these levels)":
                                                (xs, [c["output_tok_s"]["predicted"] for c in points])}))
                rep.charts.append(Chart(f"Serving: TTFT p50 vs requests in flight — {name}", "requests in flight",
                                        "TTFT p50 ms", {
                                            "measured": (xs, [c["ttft_p50_ms"]["measured"] for c in points]),
                                            "predicted (fitted on these levels)":
                                                (xs, [c["ttft_p50_ms"]["predicted"] for c in points])}))
    _add_drawn_lengths(rep, runs_dirs)
    if not rows:
        return
    rep.add("Serving under load: measured vs predicted", "table", rows,
            ["engine", "device", "check", "load", "out tok/s measured", "predicted", "error", "TTFT p50 ms measured",
             "predicted", "error"],
            note="The serving model's server terms fitted on these runs' concurrency levels; 'held out' refits without "
                 "each run's highest concurrency; request-rate levels are never fitted, except on an engine and "
                 "device measured at request rates only (imported results), fitted on them: there 'held out' refits "
                 "without each request rate. A level run in rounds is read as the median of its rounds, each "
                 "divided first by the drift the run's levels share in that round (docs/model.md; the held-out "
                 "level with the fitted levels' factors, its plain median of rounds in the JSON).")
    if isinstance(rep.data, dict):
        rep.data["serving"] = data


def _add_drawn_lengths(rep: Report, runs_dirs) -> None:
    """Serving runs that drew each request's lengths (``serve.range_ratio``): each level as measured (median of its
    rounds where it ran in several), with no prediction: the serving model is of fixed lengths and does not fit them
    (:func:`calibration.serving.drawn_lengths`)."""
    from calibration.serving import drawn_length_runs, level_figures
    from predictor.load import serving_key

    rows, data = [], []
    for record in drawn_length_runs(runs_dirs):
        config, serving = record["config"], record["measurements"]["serving"]
        engine = serving_key(config["engine"], (config.get("serve") or {}).get("server"))
        device = (record.get("provenance") or {}).get("host_id") or config.get("device")
        for level in serving.get("levels") or []:
            if not level.get("completed"):
                continue
            load = (f"concurrency {level['concurrency']}" if level.get("concurrency") is not None
                    else f"{level['request_rate']:g} requests/s")
            figures = level_figures(level)
            rows.append([record["id"], engine, device, serving["range_ratio"], load, level["completed"],
                         _round(figures["output_tok_s"], 1), _round(figures["ttft_ms"], 1),
                         _round(figures["tpot_ms"], 2)])
            data.append({"run": record["id"], "engine": engine, "device": device,
                         "range_ratio": serving["range_ratio"], "concurrency": level.get("concurrency"),
                         "request_rate": level.get("request_rate"), "completed": level["completed"], **figures})
    if not rows:
        return
    rep.add("Serving runs with drawn lengths: measured, not modelled", "table", rows,
            ["run", "engine", "device", "range ratio", "load", "completed", "out tok/s", "TTFT p50 ms", "TPOT p50 ms"],
            note="Each request's prompt and output lengths drawn around the run's (serve.range_ratio, as vllm bench "
                 "serve --random-range-ratio). The serving model is of fixed lengths, so these runs are neither fitted "
                 "nor predicted (docs/harness.md). A level run in rounds is the median of its rounds' figures.")
    if isinstance(rep.data, dict):
        rep.data["serving_drawn_lengths"] = data
