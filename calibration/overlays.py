"""What the table adds over its scopes: the physics prior for devices of unmeasured families
(:mod:`predictor.prior`) and the per-era values of the era terms (:mod:`predictor.eras`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calibration.dataset import Block, Dataset, as_predicted, provenance, rounded, run_backend
from calibration.fit import TermRegressor
from predictor.coefficients import Coefficients
from predictor.devices import KINDS
from predictor.engines import traits

MIN_PRIOR_DEVICES = 4  # a regression on device figures from fewer devices than this is not a prior


def fit_physics_prior(eng: dict[str, Any], engine: str,
                      device_backends: dict[str, set[str | None]] | None = None) -> dict[str, Any]:
    """The physics prior (:mod:`predictor.prior`) per device kind, from the device scopes just fitted: decode's
    bandwidth efficiency limited by the bytes each compute unit keeps in flight (else the median per memory
    class), prefill's matmul efficiency limited by the FLOPs each compute unit issues per cycle (else its
    log-linear fall with the device's FLOPS per byte). Only identified device values count; CPUs (probed, not
    catalogued) are left out.

    A prior describes one llama.cpp backend's kernels: with ``device_backends`` (each device's backends in the
    fit, :func:`calibration.table.evidence_index`), a kind's prior is fitted on the devices measured on the backend
    most of its devices were measured on (``backend`` in the kind's entry), and a device of another backend takes
    no prior (:meth:`predictor.coefficients.Coefficients.lookup`)."""
    from predictor.devices import resolve_device
    from predictor.errors import BenchcalError
    from predictor.prior import flops_per_byte, flops_per_unit_cycle, memory_class

    points: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {}
    for device_id, entry in (eng.get("devices") or {}).items():
        try:
            device = resolve_device(device_id)
        except BenchcalError:
            continue
        if device.kind != "cpu":
            points.setdefault(device.kind, []).append((device_id, device, entry))
    out: dict[str, Any] = {}
    for kind, rows in sorted(points.items()):
        backend = _prior_backend([d for d, _, _ in rows], device_backends) if device_backends else None
        if backend is not None:
            rows = [(d, dev, e) for d, dev, e in rows if backend in device_backends.get(d, set())]
        bw = [(d, dev, float(e["decode_bw_efficiency"]["value"])) for d, dev, e in rows
              if (e.get("decode_bw_efficiency") or {}).get("identified")]
        ratios = {d: flops_per_byte(dev.matmul_tflops(engine), dev.bandwidth_gbs) for d, dev, _ in rows}
        # prefill's prior describes the backends' own quantized matmul kernels: a device whose prompts go through
        # an FP16 copy and the BLAS library instead (CUDA on Volta) stays out of it
        kernels = [(d, dev, e) for d, dev, e in rows if not _fp16_gemm_device(dev, engine)]
        fl = [(d, math.log(float(e["prefill_compute_efficiency"]["value"])), math.log(ratios[d]))
              for d, _, e in kernels if (e.get("prefill_compute_efficiency") or {}).get("identified") and ratios[d]]
        entry: dict[str, Any] = {}
        classes: dict[str, list[tuple[str, float]]] = {}
        for d, dev, value in bw:
            classes.setdefault(memory_class(dev.memory_type), []).append((d, value))
        # a kind whose measured devices share one memory class gains nothing over its engine scope's fit
        if len(bw) >= MIN_PRIOR_DEVICES and sum(len(items) >= 2 for items in classes.values()) >= 2:
            entry["decode_bw_efficiency"] = {
                "all": {"value": rounded(float(np.median([v for _, _, v in bw]))), "devices": sorted(d for d, _, _ in bw)},
                "by_memory_class": {cls: {"value": rounded(float(np.median([v for _, v in items]))),
                                          "devices": sorted(d for d, _ in items)}
                                    for cls, items in sorted(classes.items()) if len(items) >= 2},
                "rule": "median of the measured devices of the same memory class (two or more), else of all"}
        units = [(d, dev.bytes_per_unit_cycle, value) for d, dev, value in bw if dev.bytes_per_unit_cycle]
        if len(units) >= MIN_PRIOR_DEVICES:
            cap, per_cycle = fit_unit_limit([b for _, b, _ in units], [v for _, _, v in units])
            entry.setdefault("decode_bw_efficiency", {})["unit_limit"] = {
                "cap": rounded(cap), "bytes_per_cycle": rounded(per_cycle),
                "bytes_per_unit_cycle_range": [rounded(min(b for _, b, _ in units)), rounded(max(b for _, b, _ in units))],
                "devices": sorted(d for d, _, _ in units),
                "rule": "min(cap, bytes_per_cycle / b), b = the device's peak bandwidth per compute unit per clock cycle "
                        "(bytes): least squares in log space over the measured devices, bytes_per_cycle the smallest "
                        "the fit allows; a device without unit and clock figures takes its memory class's median"}
        flops_units = [(d, flops_per_unit_cycle(dev, engine), float(e["prefill_compute_efficiency"]["value"]))
                       for d, dev, e in kernels if (e.get("prefill_compute_efficiency") or {}).get("identified")]
        flops_units = [(d, f, v) for d, f, v in flops_units if f]
        if len(flops_units) >= MIN_PRIOR_DEVICES:
            # in thousands of FLOP per unit per cycle, the scale fit_unit_limit's grid spans
            cap, per_cycle = fit_unit_limit([f / 1e3 for _, f, _ in flops_units], [v for _, _, v in flops_units])
            entry.setdefault("prefill_compute_efficiency", {})["unit_limit"] = {
                "cap": rounded(cap), "flops_per_cycle": rounded(per_cycle * 1e3),
                "flops_per_unit_cycle_range": [rounded(min(f for _, f, _ in flops_units)),
                                               rounded(max(f for _, f, _ in flops_units))],
                "devices": sorted(d for d, _, _ in flops_units),
                "rule": "min(cap, flops_per_cycle / f), f = the device's matmul peak per compute unit per clock cycle "
                        "(FLOP): least squares in log space over the measured devices, flops_per_cycle the smallest "
                        "the fit allows; a device without unit and clock figures takes the FLOPS-per-byte fit"}
        if len(fl) >= MIN_PRIOR_DEVICES:
            x = np.array([r for _, _, r in fl])
            y = np.array([v for _, v, _ in fl])
            slope, intercept = np.polyfit(x, y, 1)
            if slope > 0:  # efficiency does not rise with FLOPS per byte: a flat prior, the median
                slope, intercept = 0.0, float(np.median(y))
            entry.setdefault("prefill_compute_efficiency", {}).update({
                "log_intercept": rounded(float(intercept)), "log_slope": rounded(float(slope)),
                "ratio_range": [rounded(float(np.exp(x.min()))), rounded(float(np.exp(x.max())))],
                "devices": sorted(d for d, _, _ in fl),
                "rule": "exp(log_intercept + log_slope * ln(r)), r = matmul TFLOPS / bandwidth GB/s clipped to the "
                        "measured devices' range, least squares in log space (slope at most 0)"})
        if entry:
            if backend is not None:
                entry["backend"] = backend
            out.setdefault("kinds", {})[kind] = entry
    return out


def _prior_backend(devices: list[str], device_backends: dict[str, set[str | None]]) -> str | None:
    """The backend most of ``devices`` were measured on (ties: the first by name); None where none names one
    (vLLM, whose kernels are its own)."""
    counts: dict[str, int] = {}
    for device in devices:
        for backend in device_backends.get(device, set()):
            if backend:
                counts[backend] = counts.get(backend, 0) + 1
    return min(counts, key=lambda b: (-counts[b], b)) if counts else None


def _fp16_gemm_device(device: Any, engine: str) -> bool:
    """Whether llama.cpp's default backend on ``device`` multiplies a prompt's quantized weights through an FP16
    copy and the BLAS library in every build (:meth:`predictor.backends.Backend.quantized_prefill_through_fp16`)."""
    from predictor.backends import default_backend

    backend = default_backend(device.vendor) if traits(engine).gguf else None  # ggml's backends: a GGUF engine
    return bool(backend is not None and backend.quantized_prefill_through_fp16(device.architecture))


def fit_unit_limit(bytes_per_unit_cycle: list[float], efficiencies: list[float]) -> tuple[float, float]:
    """(cap, bytes per cycle) of ``efficiency = min(cap, bytes_per_cycle / b)`` fitted to measured devices by least
    squares on log efficiency, over a grid (cap 0.30-1.00 by 0.005, bytes per cycle 0.5-40 by 0.01); of the
    values within rounding of the best fit, the smallest bytes per cycle: where no measured device is limited,
    the largest limit none of them contradicts (each one's efficiency at the cap)."""
    b = np.asarray(bytes_per_unit_cycle, float)
    y = np.log(np.asarray(efficiencies, float))
    caps = np.arange(0.30, 1.0 + 1e-9, 0.005)
    per_cycle = np.arange(0.5, 40.0 + 1e-9, 0.01)
    pred = np.minimum(np.log(caps)[:, None, None], np.log(per_cycle[None, :, None] / b[None, None, :]))
    loss = np.sum((y[None, None, :] - pred) ** 2, axis=2)
    near = loss <= loss.min() + 1e-9
    j = int(np.argmax(near.any(axis=0)))  # the smallest bytes per cycle among the best fits
    i = int(np.argmin(np.where(near[:, j], loss[:, j], np.inf)))
    return float(caps[i]), float(per_cycle[j])


MIN_ERA_DEVICES = 3  # an era's values describe its kernels, not one or two devices: fitted from three or more


def _mape(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(actual / predicted - 1.0)))  # on rates: tokens/s measured vs predicted


def fit_era_overlays(dataset: Dataset, table: dict[str, Any], engine: str,
                     masks: dict[str, np.ndarray] | None = None,
                     prior: Coefficients | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per build era (:mod:`predictor.eras`) and device kind, the era terms (``era_terms``) refitted on that
    era's runs, every other coefficient held at the value the table gives each run's device.

    Fitted only for a kind whose runs span two eras or more (else the table's own scopes already describe the
    one era), and kept only where the era's values bring its runs closer than the pooled table does (the
    runs show a difference); each overlay records both errors. ``Coefficients.lookup`` applies an overlay to a
    device whose own scope was not fitted on that era alone. Returns (overlays, checks): ``checks`` lists every
    (kind, era, quantity) compared, kept or not, with both errors."""
    from predictor.devices import resolve_device
    from predictor.eras import era_applies, era_terms, eras, no_era_architectures
    from predictor.errors import BenchcalError

    names = era_terms(engine)
    if not names:
        return {}, []
    skipped = no_era_architectures(engine)

    def era_device(device_id: str) -> bool:  # runs of architectures the eras do not describe stay out
        try:
            return era_applies(engine, resolve_device(device_id))
        except BenchcalError:
            return True
    pooled = as_predicted(table, prior)
    out: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    for kind in KINDS:
        rows_of: dict[str, np.ndarray] = {}
        for quantity in ("decode", "prefill"):
            block = dataset.blocks[quantity]
            meta = block.meta
            mask = ((meta["engine"].to_numpy() == engine) & (meta["kind"].to_numpy() == kind) & block.fittable
                    & (masks[quantity] if masks else True))
            if skipped and kind == "gpu":
                mask &= np.array([era_device(str(d)) for d in meta["device_id"].to_numpy()], dtype=bool)
            if kind == "gpu" and traits(engine).gguf:
                # the discrete GPUs' eras are CUDA's (MMQ, CUDA graphs: the eras file's marked_by): other
                # backends' runs (ROCm) stay out of their fits
                mask &= np.array([run_backend(row) == "CUDA" if m else False
                                  for m, (_, row) in zip(mask, meta.iterrows(), strict=True)], dtype=bool)
            rows_of[quantity] = mask
        present = {e for q in rows_of for e in dataset.blocks[q].meta["era"].to_numpy()[rows_of[q]] if e}
        if len(present) < 2:
            continue
        for era in eras(engine):
            if era.id not in present:
                continue
            entry: dict[str, Any] = {}
            errors: dict[str, dict[str, float]] = {}
            for quantity in ("decode", "prefill"):
                block = dataset.blocks[quantity]
                rows = np.flatnonzero(rows_of[quantity] & (block.meta["era"].to_numpy() == era.id))
                fitted, err = _fit_era_terms(block, rows, pooled, names)
                if fitted:
                    entry.update(fitted)
                    errors[quantity] = {**err, **_cross_era_errors(block, rows_of[quantity], era.id, pooled, fitted)}
            kept = {q: e for q, e in errors.items() if _era_kept(e)}
            checks += [{"kind": kind, "era": era.id, "quantity": q, "fallback_mape": e["pooled"],
                        "era_mape": e["era"], **{k: e[k] for k in ("cross_era_without", "cross_era_with",
                                                                   "cross_era_devices") if k in e},
                        "kept": q in kept,
                        "devices": sorted({d for item in entry.values() if item["quantity"] == q
                                           for d in item["devices"]})} for q, e in errors.items()]
            entry = {n: item for n, item in entry.items() if item["quantity"] in kept}
            if entry:
                out.setdefault(era.id, {"label": era.label, "kinds": {}})["kinds"][kind] = {
                    **entry, "in_era_mape": {q: kept[q] for q in kept}}
    return out, checks


def _era_kept(errors: dict[str, Any]) -> bool:
    """Whether an era's values are kept: where devices measured on this era's builds and on others exist, their
    runs of this era predicted from their other runs must come closer with the era's values than without
    (:func:`_cross_era_errors`: what the overlay is for, a device measured on other builds); else, the era's
    runs must come closer than with the pooled table."""
    if "cross_era_with" in errors:
        return errors["cross_era_with"] < errors["cross_era_without"]
    return errors["era"] < errors["pooled"]


def _cross_era_errors(block: Block, mask: np.ndarray, era_id: str, pooled: Coefficients,
                      fitted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each device with runs of this era and of another: its scope fitted on its other runs alone (from its
    family's or the engine's values, as the table fits it), then its runs of this era predicted with that scope
    as it is and with the era's values in place of its era terms. Returns the MAPEs of both over those runs and
    the devices (empty where no device was measured on both)."""
    from calibration.dataset import row_coefficient_sets, weights_for
    from calibration.features import combine

    meta = block.meta
    era = np.asarray([e if isinstance(e, str) else "" for e in meta["era"].to_numpy()], dtype=object)
    devices = meta["device_id"].to_numpy()
    in_era, other = mask & (era == era_id), mask & (era != era_id) & (era != "")
    terms = block.features.terms
    names = [t.name for t in terms]
    overlay = {names.index(n): float(terms[names.index(n)].weight(item["value"])) for n, item in fitted.items()}
    knees = {names.index(n): float(item["unit_knee"]) for n, item in fitted.items() if item.get("unit_knee")}
    actual, without, with_era, used = [], [], [], []
    for device in sorted(set(devices[in_era]) & set(devices[other])):
        train = np.flatnonzero(other & (devices == device))
        test = np.flatnonzero(in_era & (devices == device))
        start = weights_for(block, row_coefficient_sets(meta.iloc[train[:1]].assign(device_id="\0none"), pooled,
                                                        eras=False))[0]
        if len(train) < 3 or not np.all(np.isfinite(start)):
            continue
        cpu = bool(np.all(meta["kind"].to_numpy()[train] == "cpu"))
        held = ("decode_bw_efficiency",) if block.quantity == "prefill" else ()
        fit = TermRegressor(start, cpu=cpu, held=held).fit(block.features.take(train), block.y[train])
        own = np.tile(fit.coef_, (len(test), 1))
        era_weights = own.copy()
        flops = _row_flops(block, test[:1])[0] if knees else np.nan
        for j, w in overlay.items():
            era_weights[:, j] = w * (max(1.0, flops / knees[j]) if j in knees and np.isfinite(flops) else 1.0)
        plain = block.features.take(test)
        actual.append(block.y[test])
        without.append(combine(plain, own))
        with_era.append(combine(plain, era_weights))
        used.append(device)
    if not used:
        return {}
    y = np.concatenate(actual)
    return {"cross_era_without": rounded(_mape(np.concatenate(without), y)),
            "cross_era_with": rounded(_mape(np.concatenate(with_era), y)), "cross_era_devices": used}


def _fit_era_terms(block: Block, rows: np.ndarray, pooled: Coefficients,
                   names: tuple[str, ...]) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Fit the era terms of one quantity on ``rows``, the others held per row at the values a device nobody
    measured gets (its family, else the engine scope); (entries, in-era MAPEs of that fallback without and with
    the era's values)."""

    terms = block.features.terms
    free = [j for j, t in enumerate(terms) if t.name in names]
    if len(rows) < 3 or not free:
        return {}, {}
    entries, errors = _fit_era_free(block, rows, pooled, free)
    term_names = [t.name for t in terms]
    if ("decode_fixed_per_layer_us" in names and "decode_fixed_per_layer_us" not in entries
            and "decode_fixed_ms" in names and block.quantity == "decode"):
        # Runs of similar depth cannot tell a fixed time per step from one per layer; the era's change (CUDA
        # graphs: fewer, cheaper launches) is per kernel, so per layer: fit that, the step's fixed time held at
        # what a device nobody measured gets.
        entries, errors = _fit_era_free(block, rows, pooled, [j for j in free if term_names[j] != "decode_fixed_ms"])
    return entries, errors


def _fit_era_free(block: Block, rows: np.ndarray, pooled: Coefficients,
                  free: list[int]) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """:func:`_fit_era_terms` with the terms at positions ``free`` fitted, every other one held per run."""
    from calibration.dataset import row_coefficient_sets, weights_for
    from calibration.features import combine

    terms = block.features.terms
    # what a device nobody measured gets: its family's (else the engine's) pooled values, no era overlay
    sets = row_coefficient_sets(block.meta.iloc[rows].assign(device_id="\0none"), pooled, eras=False)
    weights = weights_for(block, sets)  # (len(rows), terms): the pooled fallback's weights per run
    ok = np.all(np.isfinite(weights), axis=1)
    rows, weights = rows[ok], weights[ok]
    if len(rows) < 3:
        return {}, {}
    held = np.array([j not in free for j in range(len(terms))])
    plain = block.features.take(rows)
    start = np.where(held, 1.0, np.median(weights, axis=0))
    y = block.y[rows]
    cpu = bool(np.all(block.meta["kind"].to_numpy()[rows] == "cpu"))
    held_names = tuple(t.name for j, t in enumerate(terms) if held[j])
    names = [t.name for t in terms]
    compute = names.index(KNEE_TERM) if block.quantity == "prefill" and KNEE_TERM in names else None
    flops = _row_flops(block, rows) if compute is not None and compute in free else np.full(len(rows), np.nan)

    def fit_with(knee: float | None):
        local = block.features.take(rows)
        local.x[:, held] *= weights[:, held]  # a held term enters at its run's own weight: start weight 1
        if knee is not None:  # the era's kernels issue at most what a unit at the knee does: 1/eff x f/knee
            local.x[:, compute] *= np.where(np.isfinite(flops), np.maximum(1.0, flops / knee), 1.0)
        fit = TermRegressor(start, cpu=cpu, held=held_names).fit(local, y)
        loss = _mape(combine(local, np.tile(fit.coef_, (len(rows), 1))), y) if fit.fitted_[compute or 0] else np.inf
        return local, fit, loss

    local, fit, loss = fit_with(None)
    knee = None
    if np.isfinite(flops).any():
        # the knee that fits the era's runs best; of equal fits, the smallest (a knee beyond every measured
        # device's f leaves them all as they are: the largest limit none of them contradicts)
        for candidate in KNEE_GRID:
            trial = fit_with(float(candidate))
            if trial[2] < loss - 1e-9 or (trial[2] <= loss + 1e-9 and (knee is None or candidate < knee)):
                (local, fit, loss), knee = trial, float(candidate)
    meta = block.meta.iloc[rows]
    if not any(fit.fitted_[j] for j in free) or meta["device_id"].nunique() < MIN_ERA_DEVICES:
        return {}, {}
    if any(fit.fitted_[j] and terms[j].value(fit.coef_[j]) < 0 for j in free):
        return {}, {}  # a negative fixed time beside other devices' per-layer terms: not physical
    errors = {"pooled": rounded(_mape(combine(plain, weights), y)),
              "era": rounded(_mape(combine(local, np.tile(fit.coef_, (len(rows), 1))), y))}
    entries = {}
    for j in free:
        if not fit.fitted_[j]:
            continue
        entries[terms[j].name] = {"value": rounded(float(terms[j].value(fit.coef_[j]))), "identified": True,
                                  "quantity": block.quantity, **provenance(block, rows), "n_trimmed": fit.n_trimmed_}
        if j == compute and knee is not None:
            entries[terms[j].name]["unit_knee"] = rounded(knee)
    return entries, errors


KNEE_TERM = "prefill_compute_efficiency"
# FLOP per compute unit per clock cycle: where an era's prefill kernels stop keeping up with a unit's matmul peak
KNEE_GRID = np.round(np.geomspace(400.0, 8000.0, 46), 1)


def _row_flops(block: Block, rows: np.ndarray) -> np.ndarray:
    """Each row's device's matmul peak per compute unit per clock cycle (NaN without the figures)."""
    from predictor.devices import resolve_device
    from predictor.errors import BenchcalError
    from predictor.prior import flops_per_unit_cycle

    out = np.full(len(rows), np.nan)
    meta = block.meta.iloc[rows]
    for i, (device_id, engine) in enumerate(zip(meta["device_id"], meta["engine"], strict=True)):
        try:
            value = flops_per_unit_cycle(resolve_device(str(device_id)), str(engine))
        except BenchcalError:
            value = None
        out[i] = value if value else np.nan
    return out
