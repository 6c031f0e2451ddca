"""The coefficient table: fit every scope (engine, device family, device) and write the file ``predict`` reads.

Scopes are fitted from the least to the most specific. The engine scope starts from the engine
defaults (``predictor.coefficients.ENGINE_DEFAULTS``), a family from its engine scope, a device from its
family. Within a scope, decode is fitted first (prefill's bandwidth-bound branch uses the scope's decode
bandwidth efficiency), then prefill, then memory. A coefficient the scope's runs cannot identify is
written with its parent's value and ``"identified": false``, so the table says what was measured and
what was carried over.

Each coefficient entry: ``value``, ``uncertainty`` (1-sigma, same unit as the value, from a bootstrap
over runs), ``identified``, ``n_runs``, ``n_points``, ``devices``, ``models``, ``engine_versions``, ``note``;
:mod:`calibration.crossval` adds ``cv_mape`` and the scope's ``error_band``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.dataset import QUANTITIES, Block, Dataset
from calibration.fit import acts_on, fit_terms
from predictor.coefficients import ENGINE_DEFAULTS, Coefficients

SCHEMA_VERSION = 1
DEFAULT_BOOTSTRAP = 100


@dataclass
class ScopeRows:
    """Which rows of each block belong to a scope (boolean masks)."""

    scope: str  # "engine", "family:<name>" or "device:<id>"
    masks: dict[str, np.ndarray]


def _parent_values(table: dict[str, Any], engine: str, scope: str, family: str | None) -> dict[str, float]:
    """Coefficient values of the scope above ``scope`` in the table built so far."""
    coeffs = Coefficients(table)
    if scope == "engine":
        return {name: value for name, (value, _src) in ENGINE_DEFAULTS[engine].items()}
    if scope.startswith("family:"):
        return dict(coeffs.lookup(engine, "\0none", "\0none").values)
    return dict(coeffs.lookup(engine, "\0none", family or "\0none").values)


def _distinct(values) -> list[str]:
    return sorted({str(v) for v in values if v is not None and v == v})


def _provenance(block: Block, rows: np.ndarray) -> dict[str, Any]:
    meta = block.meta.iloc[rows]
    return {
        "n_runs": int(meta["id"].nunique()),
        "n_points": int(len(rows)),
        "devices": _distinct(meta["device_id"]),
        "models": _distinct(meta["model_key"]),
        "engine_versions": _distinct(meta["engine_version"]),
    }


def _bootstrap_std(block: Block, rows: np.ndarray, start: np.ndarray, chosen: list[int], cpu: bool,
                   held: tuple[str, ...], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """1-sigma spread of each chosen term's value over a bootstrap of runs (clusters of points)."""
    if n_boot <= 0 or not chosen:
        return np.full(len(block.features.terms), np.nan)
    run_ids = block.meta["id"].to_numpy()[rows]
    unique = np.unique(run_ids)
    if len(unique) < 3:
        return np.full(len(block.features.terms), np.nan)
    by_run = {rid: rows[run_ids == rid] for rid in unique}
    samples = []
    for _ in range(n_boot):
        picked = np.concatenate([by_run[r] for r in rng.choice(unique, size=len(unique), replace=True)])
        fit = fit_terms(block.features, picked, block.y[picked], start, cpu=cpu, held=held, trim=False,
                        fixed_set=chosen)
        samples.append([float(t.value(w)) for t, w in zip(block.features.terms, fit.weights, strict=True)])
    spread = np.std(np.asarray(samples), axis=0, ddof=1)
    spread[[j for j in range(len(spread)) if j not in chosen]] = np.nan
    return spread


# Fitted per device and family only: prefill's unpacking cost on unified-memory GPUs (Metal dequantizes weight
# tiles in its matmul kernels) pooled with the discrete GPUs' runs at engine scope would shift the engine-wide
# matmul efficiency every unmeasured GPU falls back to.
ENGINE_HELD = ("prefill_unpack_flops_per_weight",)


def fit_scope_quantity(block: Block, mask: np.ndarray, parent: dict[str, float], *, n_boot: int,
                       rng: np.random.Generator, scope_label: str) -> dict[str, dict[str, Any]]:
    """Fit one quantity in one scope; returns coefficient entries (empty when the scope has no data)."""
    rows = np.flatnonzero(mask & block.fittable)
    if len(rows) == 0:
        return {}
    terms = block.features.terms
    held = ("decode_bw_efficiency",) if block.quantity == "prefill" else ()
    if block.quantity == "prefill" and scope_label == "engine default":
        held += ENGINE_HELD
    cpu = bool(np.all(block.meta["kind"].to_numpy()[rows] == "cpu"))
    start = np.array([float(t.weight(parent[t.name])) for t in terms])
    fit = fit_terms(block.features, rows, block.y[rows], start, cpu=cpu, held=held)
    chosen = [j for j in range(len(terms)) if fit.fitted[j]]
    spread = _bootstrap_std(block, rows, start, chosen, cpu, held, n_boot, rng)
    touches = acts_on(block.features, rows, block.y[rows])
    acting = np.any(touches, axis=0)
    entries: dict[str, dict[str, Any]] = {}
    for j, term in enumerate(terms):
        if term.name in held:
            continue
        identified = bool(fit.fitted[j])
        if not identified and not acting[j]:
            continue  # the term never acts on these runs (e.g. host bandwidth without offload)
        value = float(term.value(fit.weights[j]))
        # provenance: the runs the term acts on (the dequantization term only on some devices, say)
        prov = _provenance(block, rows[touches[:, j]] if acting[j] else rows)
        entry = {"value": _round(value), "uncertainty": _round(spread[j]) if np.isfinite(spread[j]) else None,
                 "identified": identified, "quantity": block.quantity, **prov, "n_trimmed": fit.n_trimmed}
        if not identified:
            entry["note"] = (f"not identifiable from these runs (too few points or a degenerate design): "
                             f"held at the {scope_label} value")
        elif term.name == "decode_fixed_ms" and value < 0:
            entry["note"] = ("negative offset next to a carried-over per-layer term: decode_fixed_ms + "
                             "decode_fixed_per_layer_us x layers stays >= 0 for the layer counts measured")
        entries[term.name] = entry
    return entries


def _round(x: float) -> float:
    return float(f"{float(x):.6g}")


def scopes_of(dataset: Dataset, engine: str, masks: dict[str, np.ndarray] | None = None) -> list[ScopeRows]:
    """Engine scope, then each family, then each device with observations (in that order).

    The engine scope is the fallback for accelerators nobody measured, so it is fitted on accelerator runs
    only: the host CPU (its own device and family) says nothing about a GPU's CUDA context or kernels.
    """
    blocks = dataset.blocks
    base = {q: (blocks[q].meta["engine"].to_numpy() == engine) & (masks[q] if masks else True)
            for q in QUANTITIES}
    accelerators = {q: base[q] & (blocks[q].meta["kind"].to_numpy() != "cpu") for q in QUANTITIES}
    out = [ScopeRows("engine", accelerators)]
    for key, column in (("family", "family"), ("device", "device_id")):
        names: set[str] = set()
        for q in QUANTITIES:
            names |= set(blocks[q].meta[column].to_numpy()[base[q] & blocks[q].fittable])
        for name in sorted(n for n in names if n):
            out.append(ScopeRows(f"{key}:{name}",
                                 {q: base[q] & (blocks[q].meta[column].to_numpy() == name) for q in QUANTITIES}))
    return out


def _device_family(dataset: Dataset, device: str) -> str | None:
    for block in dataset.blocks.values():
        hit = block.meta.loc[block.meta["device_id"] == device, "family"]
        if len(hit):
            return str(hit.iloc[0])
    return None


def fit_table(dataset: Dataset, masks: dict[str, np.ndarray] | None = None, *, n_boot: int = 0,
              seed: int = 0, source: str = "benchcal calibrate") -> dict[str, Any]:
    """Fit every scope of every engine on the rows selected by ``masks`` (all rows when None).

    Returns the coefficients-file document (``predictor.coefficients`` schema) with provenance per
    coefficient. ``n_boot``: bootstrap resamples for uncertainties (0: none, as in cross-validation).
    """
    rng = np.random.default_rng(seed)
    table: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "created_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "engines": {},
    }
    for engine in dataset.engines():
        if engine not in ENGINE_DEFAULTS:
            continue
        eng: dict[str, Any] = {"default": {}, "families": {}, "devices": {}}
        table["engines"][engine] = eng
        for scope in scopes_of(dataset, engine, masks):
            family = _device_family(dataset, scope.scope[7:]) if scope.scope.startswith("device:") else None
            label = {"engine": "engine default", "family": "engine scope", "device": "family scope"}[
                scope.scope.split(":")[0]]
            entry: dict[str, Any] = {}
            parent = _parent_values(table, engine, scope.scope, family)
            for quantity in QUANTITIES:
                fitted = fit_scope_quantity(dataset.blocks[quantity], scope.masks[quantity], parent,
                                            n_boot=n_boot, rng=rng, scope_label=label)
                entry.update(fitted)
                parent.update({name: item["value"] for name, item in fitted.items()})
            if not entry:
                continue
            if scope.scope == "engine":
                eng["default"] = entry
            elif scope.scope.startswith("family:"):
                eng["families"][scope.scope[7:]] = entry
            else:
                eng["devices"][scope.scope[7:]] = entry
    return table
