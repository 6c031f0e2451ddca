"""The serving model's server terms, fitted from serving runs (``benchcal bench --serve``), and how well the
fitted model predicts a concurrency it was not fitted on.

For every level of every ok serving run, :mod:`predictor.load` gives the step times of the run's configuration
from the calibrated analytical model, and its figures are linear in the server's terms (``prefill_scale``,
``decode_scale``, ``step_overhead_ms``, ``seq_overhead_ms``, ``request_overhead_ms``). Per engine and device they
are fitted, non-negative, by least squares on the relative
errors of the measured TTFT, TPOT and end-to-end latency (p50) of every concurrency level (of a level run in
rounds, the median of its rounds' own figures, each round's first divided by the drift the run's levels share in
that round: :func:`round_factors`, :func:`normalized`). The held-out check refits without each run's highest
concurrency and predicts it: output tokens/s and TTFT p50 against what was measured, read with the round factors
of the fitted levels alone.
Request-rate levels (Poisson arrivals) are never fitted: each is predicted by :func:`predictor.load.rate_figures`
from the fit, with the same arrivals the load generator drew (its ``arrival_seed``), and compared.

Imported serving results (``benchcal import vllm-bench`` or ``guidellm``: ``measurements.serve``) are levels too,
with the file's mean prompt and output lengths as fixed lengths and its load split evenly over the replicas it
names (``replicas``, e.g. llm-d's ``decode_replicas``: one GPU's share). A ``max_concurrency`` result is a closed-loop
level like the harness's; a result at a finite request rate is a rate level, simulated with Poisson arrivals drawn
from seed 0 (the file keeps no seed: the same rate, not the same draws) and vLLM's default batch limits on the
device. Left out: other arrivals than Poisson ones, and an infinite rate without ``max_concurrency`` (every request
sent at once: how many are in flight then depends on the client's connection pool and any gateway in front, which
the file does not record; the public L40S results measured at it disagree with each other 4.7x in TTFT). An engine
and device with concurrency levels is fitted on them as above; one with request-rate levels only (published
``vllm bench serve`` runs often set a rate and no concurrency) is fitted on those, by nonlinear least squares over the
simulation, and its held-out check refits without each load (each request rate) in turn and predicts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from calibration.features import run_arch, run_device
from calibration.observations import run_row
from harness import records
from harness.serving.config import level_requests
from predictor.errors import BenchcalError
from predictor.load import (
    DEFAULT_MAX_NUM_SEQS,
    OVERHEADS,
    rate_figures,
    serving_figures,
    serving_key,
    serving_mode,
    step_curve,
    step_times,
)
from predictor.memory import vllm_batch_defaults
from predictor.scenario import Scenario

TARGETS = ("ttft_ms", "tpot_ms", "e2el_ms")


def serving_levels(runs_dirs: Iterable[str | Path], coefficients: Any = "default") -> list[dict[str, Any]]:
    """One entry per measured level of every ok serving run: what was measured and the model's step times."""
    out = []
    for root in runs_dirs:
        for stored in records.iter_records(root, on_error=lambda path, message: None):
            record = stored.record
            config = record.get("config") or {}
            serving = (record.get("measurements") or {}).get("serving") or {}
            if record.get("status") == "ok" and not config.get("serve") \
                    and (record.get("measurements") or {}).get("serve"):
                try:
                    level = imported_level(stored.path, record, coefficients)
                except BenchcalError:  # an imported CPU result: no probe of the host it ran on
                    continue
                if level is not None:
                    out.append(level)
                continue
            if not config.get("serve") or record.get("status") != "ok" or drawn_lengths(record):
                continue
            row = run_row(stored.path, record)
            scenario = Scenario.from_config(
                config, model=run_arch(str(row["model"]), str(row["arch_overrides"])), device=run_device(row),
                prompt_tokens=int(serving["prompt_tokens"])).replace(
                host_bandwidth_gbs=row["host_bandwidth_gbs"] if row["device"] != "cpu" else None)
            server = config["serve"].get("server")
            mode = serving_mode(config["engine"], server)
            max_num_seqs = config["serve"].get("max_num_seqs")
            run_entries: list[dict[str, Any]] = []
            for level in serving.get("levels") or []:
                if not level.get("completed"):
                    continue
                figures = level_figures(level)
                entry = {"run": record["id"], "series": record["id"], "engine": serving_key(config["engine"], server),
                         "device": row["device"], "device_id": scenario.device.id, "model": row["model_key"], "mode": mode,
                         "concurrency": None, "max_num_seqs": max_num_seqs,
                         "output_tokens": int(serving["output_tokens"]), "measured": dict(figures), "raw": figures,
                         "rounds": list(level.get("rounds") or [])}
                if level.get("concurrency") is not None:
                    entry["concurrency"] = int(level["concurrency"])
                    entry["times"] = step_times(scenario, level["concurrency"], serving["output_tokens"], coefficients,
                                                max_num_seqs)
                elif level.get("request_rate"):
                    # the arrivals drawn: the serve table's requests (each round of the level replays them)
                    drawn = level_requests(config["serve"], level["request_rate"])
                    largest = 1 if mode == "serial" else min(int(max_num_seqs or DEFAULT_MAX_NUM_SEQS), drawn)
                    entry.update({"request_rate": float(level["request_rate"]), "requests": drawn,
                                  "arrival_seed": level.get("arrival_seed"),
                                  "prompt_tokens": int(serving["prompt_tokens"]),
                                  "curve": step_curve(scenario, serving["output_tokens"], largest, coefficients)})
                else:
                    continue
                run_entries.append(entry)
            out += normalized(run_entries, [e for e in run_entries if e["concurrency"] is not None])
    return out


ROUND_FIGURES = {"ttft_ms": "ttft_p50_ms", "tpot_ms": "tpot_p50_ms", "e2el_ms": "e2el_p50_ms",
                 "output_tok_s": "output_tok_s"}


def _round_values(entry: Mapping[str, Any], key: str) -> list[float | None]:
    """A level's figure in each of its rounds, in the order they ran (None where a round has none)."""
    return [float(r[key]) if r.get("completed") and isinstance(r.get(key), (int, float)) and r[key] > 0 else None
            for r in entry.get("rounds") or []]


def round_factors(reference: list[Mapping[str, Any]]) -> dict[str, list[float]] | None:
    """Per figure (:data:`ROUND_FIGURES`), each round's factor: the median over the ``reference`` levels (one run's,
    all run in the same rounds) of the level's figure in that round against its median over the rounds. The levels
    of a round run within seconds of each other, a round after another a minute apart: the host's speed moves them
    together (on the 2-core host one round reads 1.5-2x another at every level), and the factor is that shared part.
    None where the levels have no rounds in common (one round, or different counts)."""
    counts = {len(e.get("rounds") or []) for e in reference}
    if len(counts) != 1 or min(counts) < 2:
        return None
    (count,) = counts
    out = {}
    for figure, key in ROUND_FIGURES.items():
        logs = []  # per level, each round's log ratio to the level's median
        for entry in reference:
            values = _round_values(entry, key)
            present = [v for v in values if v is not None]
            if present:
                middle = float(np.median(present))
                logs.append([math.log(v / middle) if v is not None else None for v in values])
        if logs:
            factors = []
            for i in range(count):
                column = [row[i] for row in logs if row[i] is not None]
                factors.append(math.exp(float(np.median(column))) if column else 1.0)
            out[figure] = factors
    return out


def normalized(entries: list[dict[str, Any]], reference: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``entries`` (levels of one run) whose ``measured`` figures are each the median over the level's
    rounds of its figure in a round divided by that round's factor from the ``reference`` levels
    (:func:`round_factors`): the level's figure at the host's typical speed over the run, rather than in whichever
    rounds the median falls on. ``raw`` keeps the plain median of the rounds (:func:`level_figures`). Unchanged
    where the levels have no rounds in common."""
    factors = round_factors(reference)
    count = len(reference[0]["rounds"]) if factors is not None else None
    out = []
    for entry in entries:
        copy = dict(entry)
        if count is not None and len(entry.get("rounds") or []) == count:
            copy["measured"] = dict(entry["raw"])
            for figure, per_round in factors.items():
                values = [v / f for v, f in zip(_round_values(entry, ROUND_FIGURES[figure]), per_round, strict=True)
                          if v is not None]
                if values:
                    copy["measured"][figure] = float(np.median(values))
        out.append(copy)
    return out


def drawn_lengths(record: Mapping[str, Any]) -> bool:
    """Whether a serving run drew each request's lengths (``serve.range_ratio``). Such runs are not fitted: the
    serving model's closed loop is of fixed lengths, and with lengths drawn a level's last requests, the longest,
    run on with fewer in flight (on the 2-core host, fitted on such a run at range ratio 0.5, the model read vLLM's
    output tokens/s 9-17% high in-sample at 2-8 in flight)."""
    serving = (record.get("measurements") or {}).get("serving") or {}
    return float(serving.get("range_ratio") or 0.0) > 0.0


def drawn_length_runs(runs_dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The ok serving runs under ``runs_dirs`` that drew their lengths (:func:`drawn_lengths`): the fit leaves them
    out, the report lists them as measured."""
    return [record for record in _ok_serving_records(runs_dirs) if drawn_lengths(record)]


def _ok_serving_records(runs_dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The ok records under ``runs_dirs`` of runs the harness measured under load (``config.serve`` set)."""
    return [stored.record for root in runs_dirs
            for stored in records.iter_records(root, on_error=lambda path, message: None)
            if stored.record.get("status") == "ok" and (stored.record.get("config") or {}).get("serve")]


def level_figures(level: Mapping[str, Any]) -> dict[str, float | None]:
    """What a harness level measured, on its own: TTFT, TPOT and end-to-end p50 and output tokens/s (the fit reads
    a run's levels through :func:`normalized`, which starts from these). A level
    run in several rounds (``serve.rounds``) gives the median over its rounds of each round's own figure: a round
    slowed by the host moves it less than it moves the samples pooled, and each round's p50 is that of the load the
    model describes (one burst of the level's requests), where pooled rounds put every round's first wave together."""
    rounds = [r for r in level.get("rounds") or [] if r.get("completed")]
    if rounds:
        def median(key: str) -> float | None:
            values = [float(r[key]) for r in rounds if isinstance(r.get(key), (int, float))]
            return float(np.median(values)) if values else None

        return {"ttft_ms": median("ttft_p50_ms"), "tpot_ms": median("tpot_p50_ms"), "e2el_ms": median("e2el_p50_ms"),
                "output_tok_s": median("output_tok_s")}
    return {"ttft_ms": level["ttft_ms"]["p50"], "tpot_ms": level["tpot_ms"]["p50"], "e2el_ms": level["e2el_ms"]["p50"],
            "output_tok_s": level["output_tok_s"]}


def _median(stats: Any) -> float | None:
    if not isinstance(stats, Mapping):
        return None
    value = stats.get("median", stats.get("p50"))
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _rate(value: Any) -> float | None:
    """A result's request rate: a number, ``inf`` (vLLM writes the string) or None."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _series(record: Mapping[str, Any]) -> str:
    """The levels measured together: an imported file (one record per level), named by its source and name."""
    prov = record.get("provenance") or {}
    return f"{prov.get('source_url') or ''}#{prov.get('imported_from') or record['id']}"


def imported_level(path: Path, record: Mapping[str, Any], coefficients: Any = "default") -> dict[str, Any] | None:
    """The level of one imported serving result (see the module docstring), or None when it cannot be one: no
    lengths, no median TTFT or TPOT, or arrivals other than a fixed concurrency or Poisson ones."""
    config = record.get("config") or {}
    serve = (record.get("measurements") or {}).get("serve") or {}
    prompt = (config.get("prompt_tokens") or [0])[0]
    output = int(config.get("gen_tokens") or 0)
    ttft, tpot = _median(serve.get("ttft_ms")), _median(serve.get("tpot_ms"))
    if not prompt or output < 2 or ttft is None or tpot is None or not serve.get("output_throughput"):
        return None
    replicas = max(int(serve.get("replicas") or 1), 1)
    rate = _rate(serve.get("request_rate"))
    concurrency = serve.get("max_concurrency")
    if serve.get("guidellm_strategy") not in (None, "synchronous", "concurrent", "poisson") \
            or float(serve.get("burstiness") or 1.0) != 1.0:
        return None
    row = run_row(path, dict(record))
    scenario = Scenario(
        model=run_arch(str(row["model"]), str(row["arch_overrides"])), device=run_device(row),
        engine=str(config["engine"]), quant=config.get("quant"), context=int(config["context"]),
        prompt_tokens=int(prompt), kv_dtype=config.get("kv_dtype"),
        flash_attn=bool((config.get("engine_options") or {}).get("flash_attn", False)))
    mode = serving_mode(str(config["engine"]))
    max_batched, max_num_seqs = vllm_batch_defaults(scenario.device) if mode == "continuous" else (None, 1)
    entry: dict[str, Any] = {
        "run": record["id"], "series": _series(record), "engine": config["engine"], "device": row["device"],
        "device_id": scenario.device.id,
        "model": row["model_key"], "mode": mode, "concurrency": None, "max_num_seqs": max_num_seqs,
        "output_tokens": output, "imported": True, "replicas": replicas,
        "measured": {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": _median(serve.get("e2el_ms")),
                     "output_tok_s": float(serve["output_throughput"]) / replicas}}
    if concurrency and (rate is None or math.isinf(rate)):  # a closed loop (vLLM writes rate inf beside it)
        entry["concurrency"] = max(round(int(concurrency) / replicas), 1)
        entry["times"] = step_times(scenario, entry["concurrency"], output, coefficients, max_num_seqs)
        return entry
    if rate is None or concurrency or math.isinf(rate):
        return None  # a rate capped by a concurrency, or everything at once: see the module docstring
    requests = max(round(int(serve.get("completed") or serve.get("num_prompts") or 0) / replicas), 1)
    largest = 1 if mode == "serial" else min(int(max_num_seqs or DEFAULT_MAX_NUM_SEQS), requests)
    entry.update({"request_rate": rate / replicas, "requests": requests, "arrival_seed": 0,
                  "prompt_tokens": int(prompt), "max_num_batched_tokens": max_batched,
                  "curve": step_curve(scenario, output, largest, coefficients)})
    return entry


PARAMETERS = ("prefill_scale", "decode_scale", "step_overhead_ms", "seq_overhead_ms", "request_overhead_ms")
SCALES = ("prefill_scale", "decode_scale")  # multiply the analytical model's times: neutral at 1, not 0
# Each scale's distance from 1, weighted so, is one more residual of the fit: a tie-break, next to relative errors
# of a few percent. A small model's decode step hardly grows with the batch, so a scale on it and an overhead per
# step fit the levels equally well; the fit then keeps the scale nearest 1 (the analytical step, which carries the
# model's size to other models on the device) rather than a step of overheads alone.
SCALE_PRIOR = 0.01


def _figures(level: Mapping[str, Any], values: Mapping[str, float]) -> dict[str, float]:
    t = level["times"]
    return serving_figures(level["mode"], level["concurrency"], level["output_tokens"], t["prefill_s"], t["step1_s"],
                           t["step_s"], max_num_seqs=level.get("max_num_seqs"), **values)


def _free_terms(levels: list[Mapping[str, Any]]) -> list[str]:
    """The :data:`PARAMETERS` the levels can tell apart: a server that runs one request at a time decodes one
    sequence per step, so its per-sequence overhead is its per-step one (it stays 0) and a scale on that one step
    is a step overhead too (it stays 1)."""
    serial = all(level["mode"] == "serial" for level in levels)
    return [p for p in PARAMETERS if not (serial and p in ("seq_overhead_ms", "decode_scale"))]


def _fixed_terms(free: list[str]) -> dict[str, float]:
    """The neutral values (:data:`predictor.load.OVERHEADS`) of the terms a fit leaves out."""
    return {p: OVERHEADS[p] for p in PARAMETERS if p not in free}


def fit_overheads(levels: list[Mapping[str, Any]]) -> dict[str, float]:
    """Non-negative :data:`PARAMETERS` minimizing the relative errors of the measured TTFT, TPOT and E2EL (p50).
    The figures are linear in them within a regime (``serving_figures``), so each column is a figure at a unit
    value. A server that runs one request at a time cannot tell a per-sequence overhead or a decode scale from a
    per-step overhead (one sequence per step): there they keep their neutral values (:func:`_free_terms`)."""
    free = _free_terms(levels)
    zero = {**{p: 0.0 for p in free}, **_fixed_terms(free)}
    rows, rhs = [], []
    for level in levels:
        base = _figures(level, zero)
        unit = {p: _figures(level, {**zero, p: 1.0}) for p in free}
        for target in TARGETS:
            measured = level["measured"].get(target)
            if not measured or not np.isfinite(measured) or measured <= 0:
                continue
            rows.append([(unit[p][target] - base[target]) / measured for p in free])
            rhs.append(1.0 - base[target] / measured)
    if not rows:
        return dict(OVERHEADS)
    for p in free:  # the scales' weak pull to 1 (:data:`SCALE_PRIOR`)
        if p in SCALES:
            rows.append([SCALE_PRIOR if q == p else 0.0 for q in free])
            rhs.append(SCALE_PRIOR)
    solution, _ = nnls(np.asarray(rows), np.asarray(rhs))
    return {**zero, **{p: float(v) for p, v in zip(free, solution, strict=True)}}


def _rate_predicted(level: Mapping[str, Any], values: Mapping[str, float]) -> dict[str, Any]:
    """:func:`predictor.load.rate_figures` for a request-rate level: its number of arrivals, from its seed, all
    counted (the level starts at an idle server)."""
    prefill, step = level["curve"]
    return rate_figures(level["mode"], level["request_rate"], level["output_tokens"], prefill, step,
                        max_num_seqs=level.get("max_num_seqs"), prompt_tokens=level["prompt_tokens"],
                        max_num_batched_tokens=level.get("max_num_batched_tokens"), requests=level["requests"],
                        warmup=0, seed=int(level.get("arrival_seed") or 0), steady_state=False,
                        **{p: float(values[p]) for p in PARAMETERS})


def fit_rates(levels: list[Mapping[str, Any]]) -> dict[str, float]:
    """:data:`PARAMETERS` (non-negative) minimizing the relative errors of the measured TTFT, TPOT and E2EL (p50)
    of request-rate levels, each simulated (:func:`_rate_predicted`): the figures are not linear in the terms once
    requests queue, so the fit is nonlinear least squares from the neutral terms."""
    free = _free_terms(levels)

    def values(x: np.ndarray) -> dict[str, float]:
        return {**_fixed_terms(free), **dict(zip(free, (float(v) for v in x), strict=True))}

    def residuals(x: np.ndarray) -> np.ndarray:
        out = [SCALE_PRIOR * (v - 1.0) for p, v in zip(free, x, strict=True) if p in SCALES]
        for level in levels:
            predicted = _rate_predicted(level, values(x))
            for target in TARGETS:
                measured = level["measured"].get(target)
                if measured and np.isfinite(measured) and measured > 0:
                    out.append(predicted[target]["p50"] / measured - 1.0)
        return np.asarray(out)

    if not any(level["measured"].get(t) and np.isfinite(level["measured"][t]) and level["measured"][t] > 0
               for level in levels for t in TARGETS):
        return dict(OVERHEADS)
    x0 = np.asarray([OVERHEADS[p] for p in free], float)
    result = least_squares(residuals, x0, bounds=(np.zeros(len(free)), np.full(len(free), np.inf)),
                           diff_step=1e-3, x_scale=np.asarray([1.0 if p in SCALES else 10.0 for p in free]))
    return values(result.x)


def _error(predicted: float, measured: float | None) -> float | None:
    return None if not measured else predicted / measured - 1.0


def fit_serving(runs_dirs: Iterable[str | Path], coefficients: Any = "default") -> dict[str, Any]:
    """``{engine: {device_id: fit}}`` (a server that serves its engine otherwise, llama-server, under its own name:
    :func:`predictor.load.serving_key`): the overheads, the levels they come from, the in-sample errors and the
    held-out errors at each run's (or imported file's) highest concurrency. Empty when no serving run was measured."""
    every = serving_levels(list(runs_dirs), coefficients)
    levels = [lv for lv in every if lv["concurrency"] is not None]
    out: dict[str, Any] = {}
    for key in sorted({(lv["engine"], lv["device_id"]) for lv in every}):
        group = [lv for lv in levels if (lv["engine"], lv["device_id"]) == key]
        if not group:
            out.setdefault(key[0], {})[key[1]] = _fit_on_rates([lv for lv in every
                                                                if (lv["engine"], lv["device_id"]) == key])
            continue
        fit = fit_overheads(group)
        rates = [_rate_check(lv, fit) for lv in every
                 if lv["concurrency"] is None and (lv["engine"], lv["device_id"]) == key]
        in_sample = [_check(lv, fit) for lv in group]
        held_out = []
        for series in sorted({lv["series"] for lv in group}):
            own = [lv for lv in group if lv["series"] == series]
            top = max(lv["concurrency"] for lv in own)
            rest = [lv for lv in own if lv["concurrency"] != top]
            if not rest:
                continue
            # the run's round factors from the levels fitted only: the held-out level's own rounds stay out of them
            own = normalized(own, rest)
            train = [lv for lv in group if lv["series"] != series] + [lv for lv in own if lv["concurrency"] != top]
            for target in (lv for lv in own if lv["concurrency"] == top):
                held_out.append(_check(target, fit_overheads(train)))
        series = len({lv["series"] for lv in group})
        imported = sum(1 for lv in group if lv.get("imported"))
        what = (f"{series} run(s)" if not imported else f"{series} imported file(s)" if imported == len(group)
                else f"{series} run(s) and imported file(s)")
        out.setdefault(key[0], {})[key[1]] = {
            **{k: round(v, 4) for k, v in fit.items()}, "levels": len(group),
            "runs": sorted({lv["run"] for lv in group}), "models": sorted({lv["model"] for lv in group}),
            "concurrency": sorted({lv["concurrency"] for lv in group}), "mode": group[0]["mode"],
            "in_sample": in_sample, "held_out": held_out, "request_rates": rates,
            "source": f"fitted from {len(group)} serving level(s) of {what}"}
    return out


def _check(level: Mapping[str, Any], fit: Mapping[str, float]) -> dict[str, Any]:
    predicted = _figures(level, fit)
    measured, raw = level["measured"], level.get("raw") or level["measured"]
    return {"run": level["run"], "concurrency": level["concurrency"],
            "output_tok_s": {"measured": measured["output_tok_s"], "predicted": round(predicted["output_tok_s"], 3),
                             "error": _error(predicted["output_tok_s"], measured["output_tok_s"]),
                             "median_of_rounds": raw["output_tok_s"]},
            "ttft_p50_ms": {"measured": measured["ttft_ms"], "predicted": round(predicted["ttft_ms"], 3),
                            "error": _error(predicted["ttft_ms"], measured["ttft_ms"]),
                            "median_of_rounds": raw["ttft_ms"]}}


def _fit_on_rates(group: list[Mapping[str, Any]]) -> dict[str, Any]:
    """An engine and device measured at request rates only: the terms fitted on every level, the in-sample checks,
    and the held-out ones (each request rate predicted by the terms fitted on the other rates)."""
    fit = fit_rates(group)
    loads = sorted({lv["request_rate"] for lv in group})
    held_out = []
    if len(loads) > 1:
        for load in loads:
            train = [lv for lv in group if lv["request_rate"] != load]
            terms = fit_rates(train)
            held_out += [_rate_check(lv, terms) for lv in group if lv["request_rate"] == load]
    return {**{k: round(v, 4) for k, v in fit.items()}, "levels": len(group),
            "runs": sorted({lv["run"] for lv in group}), "models": sorted({lv["model"] for lv in group}),
            "concurrency": [], "request_rates_fitted": loads,
            "mode": group[0]["mode"], "in_sample": [], "held_out": [],
            "request_rates": [_rate_check(lv, fit) for lv in group], "request_rates_held_out": held_out,
            "source": f"fitted from {len(group)} request-rate level(s) of {len(group)} imported result(s)"
                      if all(lv.get("imported") for lv in group)
                      else f"fitted from {len(group)} request-rate level(s)"}


def _rate_check(level: Mapping[str, Any], fit: Mapping[str, float]) -> dict[str, Any]:
    """A request-rate level against the fit's prediction: the same number of Poisson arrivals from the same seed as
    the load generator drew (all counted: the level starts at an idle server)."""
    predicted = _rate_predicted(level, fit)
    measured = level["measured"]

    def pair(value: float | None, actual: float | None) -> dict[str, Any]:
        return {"measured": actual, "predicted": None if value is None else round(value, 3),
                "error": None if value is None else _error(value, actual)}

    ttft = (predicted["ttft_ms"] or {}).get("p50")
    tpot = (predicted["tpot_ms"] or {}).get("p50")
    return {"run": level["run"], "request_rate": level["request_rate"], "requests": level["requests"],
            "saturated": predicted["saturated"],
            "output_tok_s": pair(predicted["output_tok_s"], measured["output_tok_s"]),
            "ttft_p50_ms": pair(ttft, measured["ttft_ms"]),
            "tpot_p50_ms": pair(tpot, measured["tpot_ms"])}


def _rate_text(check: Mapping[str, Any]) -> str:
    return f"{check['request_rate']:g} requests/s ({check['requests']} Poisson arrivals)"


def _rate_parts(check: Mapping[str, Any]) -> list[str]:
    parts = []
    for name, unit, key in (("output tok/s", "", "output_tok_s"), ("TTFT p50", " ms", "ttft_p50_ms"),
                            ("TPOT p50", " ms", "tpot_p50_ms")):
        item = check[key]
        if item["predicted"] is None or item["measured"] is None:
            parts.append(f"{name} {item['measured']} measured, none predicted (saturated)")
        else:
            parts.append(f"{name} {item['measured']:.1f}{unit} measured, {item['predicted']:.1f}{unit} "
                         f"predicted ({item['error']:+.1%})")
    return parts


STEP_GAP_MS = 0.5  # first tokens this close together came out of one engine step


def first_wave_groups(timeline: list[list[float | None]], concurrency: int) -> list[list[int]] | None:
    """The requests of a round's first wave (the ``concurrency`` it sends together, :func:`harness.serving.run`'s
    ``timeline_ms``) in the groups whose first tokens came together (within :data:`STEP_GAP_MS`: one engine step),
    earliest first, each request named by its place in the order sent; None where one of them has no TTFT."""
    wave = timeline[:concurrency]
    if not wave or any(sent is None or ttft is None for sent, ttft, _ in wave):
        return None
    first_token = [sent + ttft for sent, ttft, _ in wave]
    groups: list[list[int]] = []
    last = None
    for i in sorted(range(len(wave)), key=first_token.__getitem__):
        if last is None or first_token[i] - last > STEP_GAP_MS:
            groups.append([])
        groups[-1].append(i)
        last = first_token[i]
    return groups


def timeline_summary(runs_dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Per closed-loop level of every ok serving run that kept its requests' timeline: how each round's first wave
    came out of the server (the sizes of its groups of first tokens, :func:`first_wave_groups`) and the median over
    the rounds of the first group's TTFT and of the others' (each round's median)."""
    out = []
    for record in _ok_serving_records(runs_dirs):
        for level in ((record.get("measurements") or {}).get("serving") or {}).get("levels") or []:
            c = level.get("concurrency")
            if not c or not level.get("timeline_ms"):
                continue
            shapes, lead, rest = [], [], []
            for timeline in level["timeline_ms"]:
                groups = first_wave_groups(timeline, int(c))
                if groups is None:
                    continue
                shapes.append("+".join(str(len(g)) for g in groups))
                lead.append(float(np.median([timeline[i][1] for i in groups[0]])))
                others = [timeline[i][1] for g in groups[1:] for i in g]
                if others:
                    rest.append(float(np.median(others)))
            out.append({"run": record["id"], "engine": record["config"]["engine"], "concurrency": int(c),
                        "first_wave": shapes, "first_group_ttft_ms": float(np.median(lead)) if lead else None,
                        "others_ttft_ms": float(np.median(rest)) if rest else None})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m calibration.serving RUNS_DIR...``: fit the serving model over the runs' serving runs and print
    each engine's terms with the in-sample and held-out (highest concurrency) errors; JSON with ``--json``. With
    ``--timeline``, instead: how each closed-loop level's first wave of requests came out of the server."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m calibration.serving", description=main.__doc__)
    parser.add_argument("runs_dirs", nargs="+")
    parser.add_argument("--json", action="store_true", help="print the fit as JSON")
    parser.add_argument("--timeline", action="store_true",
                        help="print how each closed-loop level's first wave of requests came out of the server "
                             "(which requests got their first tokens from one step) instead of fitting")
    args = parser.parse_args(argv)
    if args.timeline:
        found = timeline_summary(args.runs_dirs)
        if not found:
            print("no serving run with a request timeline under " + ", ".join(args.runs_dirs))
            return 1
        for item in found:
            lead, rest = item["first_group_ttft_ms"], item["others_ttft_ms"]
            print(f"{item['engine']} {item['run']} concurrency {item['concurrency']}: first wave's groups of first "
                  f"tokens per round {' '.join(item['first_wave'])}; TTFT of the first group "
                  + (f"{lead:.1f} ms" if lead is not None else "none")
                  + (f", of the others {rest:.1f} ms" if rest is not None else "") + " (median of the rounds)")
        return 0
    fits = fit_serving(args.runs_dirs)
    if args.json:
        print(json.dumps(fits, indent=1))
        return 0
    drawn = [record["id"] for record in drawn_length_runs(args.runs_dirs)]
    if drawn:
        print(f"note: {len(drawn)} serving run(s) with drawn lengths (serve.range_ratio) left out: the serving model "
              f"is of fixed lengths ({', '.join(drawn)})")
    if not fits:
        print("no ok serving run or imported serving result under " + ", ".join(args.runs_dirs))
        return 1
    for engine, devices in fits.items():
        for device, fit in devices.items():
            terms = ", ".join(f"{p} {fit[p]:.3g}" for p in PARAMETERS)
            print(f"{engine} on {device} ({fit['mode']}; {fit['source']}): {terms}")
            for label, checks in (("in-sample", fit["in_sample"]), ("held out", fit["held_out"])):
                for c in checks:
                    out, ttft = c["output_tok_s"], c["ttft_p50_ms"]
                    print(f"  {label:9} concurrency {c['concurrency']}: output tok/s {out['measured']:.1f} measured, "
                          f"{out['predicted']:.1f} predicted ({out['error']:+.1%}); TTFT p50 {ttft['measured']:.0f} ms "
                          f"measured, {ttft['predicted']:.0f} predicted ({ttft['error']:+.1%})")
                    raw_out, raw_ttft = out["median_of_rounds"], ttft["median_of_rounds"]
                    if label == "held out" and (raw_out, raw_ttft) != (out["measured"], ttft["measured"]):
                        print(f"  {'':9} {'':13}{len(str(c['concurrency'])) * ' '}  plain median of its rounds: output "
                              f"tok/s {raw_out:.1f} ({_error(out['predicted'], raw_out):+.1%}); TTFT p50 "
                              f"{raw_ttft:.0f} ms ({_error(ttft['predicted'], raw_ttft):+.1%})")
            rate_label = "fitted" if fit.get("request_rates_fitted") else "never fitted"
            for label, checks in ((rate_label, fit["request_rates"]), ("held out", fit.get("request_rates_held_out", []))):
                for c in checks:
                    print(f"  {label}, {_rate_text(c)}: " + "; ".join(_rate_parts(c)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
