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
import pandas as pd

from calibration.dataset import QUANTITIES, Block, Dataset, provenance, rounded, run_backend
from calibration.fit import TermRegressor, acts_on
from calibration.overlays import fit_era_overlays, fit_physics_prior
from predictor.coefficients import ENGINE_DEFAULTS, Coefficients
from predictor.engines import traits

SCHEMA_VERSION = 1
DEFAULT_BOOTSTRAP = 100


@dataclass
class ScopeRows:
    """Which rows of each block belong to a scope (boolean masks)."""

    scope: str  # "engine", "family:<name>" or "device:<id>"
    masks: dict[str, np.ndarray]


def _parent_values(table: dict[str, Any], engine: str, scope: str, family: str | None,
                   prior: Coefficients | None = None, device: str | None = None) -> dict[str, float]:
    """Coefficient values of the scope above ``scope``: the table built so far over the ``prior`` (a table
    fitted before, e.g. the shipped one when a user calibrates their own machine), else the engine defaults.

    With a prior, a family starts from the prior's own value for that family and a device from the prior's
    value for that device (or its family), each overlaid with the scopes this fit has produced above it."""
    base = prior if prior is not None else Coefficients()
    if scope == "engine":
        return dict(base.lookup(engine, "\0none", "\0none").values)
    if scope.startswith("family:"):
        family, device = scope[len("family:"):], None
    values = dict(base.lookup(engine, device or "\0none", family or "\0none").values)
    own = ((table.get("engines") or {}).get(engine) or {})
    above = [own.get("default") or {}]
    if not scope.startswith("family:"):
        above.append((own.get("families") or {}).get(family or "\0none") or {})
    for entry in above:
        values.update({name: float(item["value"]) for name, item in entry.items()
                       if isinstance(item, dict) and "value" in item and name in values})
    return values


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
        fit = TermRegressor(start, cpu=cpu, held=held, trim=False, fixed_set=chosen).fit(
            block.features.take(picked), block.y[picked])
        samples.append([float(t.value(w)) for t, w in zip(block.features.terms, fit.coef_, strict=True)])
    spread = np.std(np.asarray(samples), axis=0, ddof=1)
    spread[[j for j in range(len(spread)) if j not in chosen]] = np.nan
    return spread


# Fitted per device and family only: prefill's unpacking cost on unified-memory GPUs (Metal dequantizes weight
# tiles in its matmul kernels) pooled with the discrete GPUs' runs at engine scope would shift the engine-wide
# matmul efficiency every unmeasured GPU falls back to; the flash-attention efficiency, measured at engine scope
# only on unified-memory GPUs (four dense pp2048 rows of a DGX Spark and an M3 Ultra, where attention is a few
# percent of the time), says nothing of a discrete GPU's attention kernels and would sit at its bound.
ENGINE_HELD = ("prefill_unpack_flops_per_weight", "prefill_attn_efficiency")
# The KV cache's read is told apart from the step's fixed time and the weights only by runs that read a long cache:
# a scope whose decode runs all read fewer tokens than this keeps its parent's KV terms (fitted from runs at 64
# tokens, where the read is a fraction of a percent of the step, a family's KV efficiency came out at 0.07 of peak
# bandwidth, which then ruled its every prediction at long context).
LONG_CONTEXT = 1024
KV_TERMS = ("decode_kv_efficiency", "decode_kv_reread")


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
    if block.quantity == "decode" and np.nanmax(block.meta["decode_context"].to_numpy(dtype=float)[rows]) < LONG_CONTEXT:
        held += KV_TERMS
    cpu = bool(np.all(block.meta["kind"].to_numpy()[rows] == "cpu"))
    start = np.array([float(t.weight(parent[t.name])) for t in terms])
    fit = TermRegressor(start, cpu=cpu, held=held).fit(block.features.take(rows), block.y[rows])
    chosen = [j for j in range(len(terms)) if fit.fitted_[j]]
    spread = _bootstrap_std(block, rows, start, chosen, cpu, held, n_boot, rng)
    touches = acts_on(block.features, rows, block.y[rows])
    acting = np.any(touches, axis=0)
    entries: dict[str, dict[str, Any]] = {}
    for j, term in enumerate(terms):
        if term.name in held:
            continue
        identified = bool(fit.fitted_[j])
        if not identified and not acting[j]:
            continue  # the term never acts on these runs (e.g. host bandwidth without offload)
        value = float(term.value(fit.coef_[j]))
        # provenance: the runs the term acts on (the dequantization term only on some devices, say)
        prov = provenance(block, rows[touches[:, j]] if acting[j] else rows)
        entry = {"value": rounded(value), "uncertainty": rounded(spread[j]) if np.isfinite(spread[j]) else None,
                 "identified": identified, "quantity": block.quantity, **prov, "n_trimmed": fit.n_trimmed_}
        if not identified:
            entry["note"] = (f"not identifiable from these runs (too few points or a degenerate design): "
                             f"held at the {scope_label} value")
        elif term.name == "decode_fixed_ms" and value < 0:
            entry["note"] = ("negative offset next to a carried-over per-layer term: decode_fixed_ms + "
                             "decode_fixed_per_layer_us x layers stays >= 0 for the layer counts measured")
        entries[term.name] = entry
    return entries


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


def vllm_worker_rows(dataset: Dataset, engine: str, device: str | None = None,
                     masks: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """The memory rows of ``engine``'s runs on a CPU (an engine that profiles its runtime: vLLM) whose pool it sized
    itself (``kv_pool`` profiled) and whose log gave its worker's non-kv usage, with ``worker_gib``: that usage minus
    the weights (one row per run)."""
    meta = dataset.blocks["memory"].meta
    if engine not in ENGINE_DEFAULTS or not traits(engine).profiled_runtime or "engine_non_kv_bytes" not in meta:
        return meta.iloc[0:0]
    rows = (meta["engine"].to_numpy() == engine) & (meta["kind"].to_numpy() == "cpu")
    rows &= meta["engine_kv_pool"].to_numpy() == "profiled"
    if device is not None:
        rows &= meta["device_id"].to_numpy() == device
    if masks is not None:
        rows &= masks["memory"]
    out = meta.loc[rows].copy()
    non_kv = pd.to_numeric(out["engine_non_kv_bytes"], errors="coerce")
    weights = pd.to_numeric(out["engine_weights_bytes"], errors="coerce")
    out["worker_gib"] = (non_kv - weights) / 2**30
    return out[np.isfinite(out["worker_gib"].to_numpy(dtype=float))].drop_duplicates("id")


def vllm_cpu_worker(dataset: Dataset, engine: str, device: str,
                    masks: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """For a CPU host's vLLM scope, ``vllm_cpu_worker_gib``: the median over its profiled runs of the worker's
    logged non-kv usage minus the weights (empty without such runs)."""
    rows = vllm_worker_rows(dataset, engine, device, masks)
    if rows.empty:
        return {}
    values = rows["worker_gib"].to_numpy(dtype=float)
    return {"vllm_cpu_worker_gib": {
        "value": rounded(float(np.median(values))), "identified": True, "n_runs": int(len(values)),
        "spread_gib": rounded(float(values.max() - values.min())),
        "models": sorted(set(rows["model_key"])),
        "source": "median of the runs' logged non-kv usage (vLLM's CPU worker) minus their weights"}}


def host_figures(dataset: Dataset, engine: str, device: str,
                 masks: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """For a CPU host's scope, ``{"host_figures": {bandwidth_gbs, matmul_gflops, n_runs}}``: the medians of the
    probe figures its runs were measured with, the scale its coefficients were fitted against, so that its
    predictions use them rather than a later probe's (empty for other devices)."""
    frames = []
    for quantity in QUANTITIES:
        meta = dataset.blocks[quantity].meta
        rows = (meta["device_id"].to_numpy() == device) & (meta["engine"].to_numpy() == engine)
        rows &= meta["kind"].to_numpy() == "cpu"
        if masks is not None:
            rows &= masks[quantity]
        frames.append(meta.loc[rows, ["id", "host_bandwidth_gbs", "host_matmul_gflops"]])
    runs = pd.concat(frames).drop_duplicates("id")
    bandwidth = pd.to_numeric(runs["host_bandwidth_gbs"], errors="coerce").dropna()
    matmul = pd.to_numeric(runs["host_matmul_gflops"], errors="coerce").dropna()
    if runs.empty or bandwidth.empty:
        return {}
    return {"host_figures": {"bandwidth_gbs": rounded(float(bandwidth.median())),
                             "matmul_gflops": rounded(float(matmul.median())) if not matmul.empty else None,
                             "n_runs": int(len(runs))}}


def _device_family(dataset: Dataset, device: str) -> str | None:
    for block in dataset.blocks.values():
        hit = block.meta.loc[block.meta["device_id"] == device, "family"]
        if len(hit):
            return str(hit.iloc[0])
    return None


def fit_table(dataset: Dataset, masks: dict[str, np.ndarray] | None = None, *, n_boot: int = 0,
              seed: int = 0, source: str = "benchcal calibrate", prior: Coefficients | None = None) -> dict[str, Any]:
    """Fit every scope of every engine on the rows selected by ``masks`` (all rows when None).

    Returns the coefficients-file document (``predictor.coefficients`` schema) with provenance per
    coefficient. ``n_boot``: bootstrap resamples for uncertainties (0: none, as in cross-validation).
    ``prior``: a table whose values start each scope and stand in for what these runs cannot identify
    (``benchcal calibrate`` of a user's runs starts from the shipped table); None: the engine defaults.
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
        scopes = scopes_of(dataset, engine, masks)
        fixed: dict[str, Any] = {}  # this engine's own: none where it has no engine scope
        for scope in scopes:
            _fit_scope(dataset, table, eng, engine, scope, prior, n_boot, rng, masks)
            if scope.scope == "engine":
                fixed = _graph_fixed_times(dataset, table, eng, engine, scope, prior)
        index = evidence_index(dataset, engine, masks)
        physics = fit_physics_prior(eng, engine, {d: {b for b, _ in pairs} for d, pairs in index["devices"].items()})
        if fixed:
            physics.setdefault("kinds", {}).setdefault("gpu", {})["fixed_times"] = fixed
        if physics:
            eng["physics"] = physics
        overlays, checks = fit_era_overlays(dataset, table, engine, masks, prior)
        if overlays:
            eng["eras"] = overlays
            # A family or device measured on one era's builds alone starts from that era's values, not from the
            # pooled ones (mostly other eras'), for what its runs cannot identify: refitted against them.
            for scope in scopes:
                era = _single_era(dataset, scope, overlays)
                if era is not None:
                    _fit_scope(dataset, table, eng, engine, scope, prior, n_boot, rng, masks, era_values=era)
        if checks:
            eng["era_checks"] = checks
        eng["evidence"] = index
    return table


def evidence_index(dataset: Dataset, engine: str, masks: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """What :mod:`predictor.evidence` reads: per device, device family and kind, the (backend, format family) pairs
    of the decode and prefill runs of ``engine`` a fit may use (:func:`calibration.dataset.run_backend`)."""
    from predictor.evidence import format_family

    pairs: dict[str, dict[str, set[tuple[str | None, str]]]] = {"devices": {}, "families": {}, "kinds": {}}
    for quantity in ("decode", "prefill"):
        block = dataset.blocks[quantity]
        rows = (block.meta["engine"].to_numpy() == engine) & block.fittable & (masks[quantity] if masks else True)
        for _, row in block.meta[rows].iterrows():
            pair = (run_backend(row), format_family(row.get("quant")))
            for key, column in (("devices", "device_id"), ("families", "family"), ("kinds", "kind")):
                if row.get(column):
                    pairs[key].setdefault(str(row[column]), set()).add(pair)
    return {key: {name: sorted([list(p) for p in found], key=lambda p: (str(p[0]), p[1]))
                  for name, found in sorted(scopes.items())} for key, scopes in pairs.items()}


def _graph_fixed_times(dataset: Dataset, table: dict[str, Any], eng: dict[str, Any], engine: str, scope: ScopeRows,
                       prior: Coefficients | None) -> dict[str, Any]:
    """The physics prior's decode fixed times for a discrete GPU nobody measured: the engine scope's era terms
    refitted on the discrete GPUs that run the eras' kernels (llama.cpp's CUDA graphs), every other term at the
    engine scope's value. A Volta or Turing GPU (``no_era_architectures``) launches every kernel by itself in every
    build, and a GPU on another backend than CUDA runs other kernels: their runs weigh on the engine scope (which unified-memory chips also fall back to) but not on what an
    unmeasured current GPU gets. Empty where no such run was left out or nothing was identified."""
    from predictor.devices import resolve_device
    from predictor.eras import era_applies, era_terms, no_era_architectures
    from predictor.errors import BenchcalError

    block = dataset.blocks["decode"]
    if not no_era_architectures(engine) or not eng.get("default"):
        return {}

    def graphs(device_id: str) -> bool:
        try:
            return era_applies(engine, resolve_device(device_id))
        except BenchcalError:
            return True

    gpu = scope.masks["decode"] & (block.meta["kind"].to_numpy() == "gpu")
    # CUDA's graphs: a GPU of another backend (ROCm) is no more one that runs them than a Volta is
    keep = np.array([graphs(str(d)) and run_backend(row) in ("CUDA", None)
                     for d, (_, row) in zip(block.meta["device_id"].to_numpy(), block.meta.iterrows(), strict=True)],
                    dtype=bool)
    if not (gpu & block.fittable & ~keep).any():
        return {}
    parent = _parent_values(table, engine, "engine", None, prior)
    parent.update({name: item["value"] for name, item in eng["default"].items()
                   if isinstance(item, dict) and "value" in item})
    fitted = fit_scope_quantity(block, gpu & keep, parent, n_boot=0, rng=np.random.default_rng(0),
                                scope_label="engine default")
    return {name: {key: item[key] for key in ("value", "n_runs", "devices") if key in item}
            for name in era_terms(engine) if (item := fitted.get(name)) and item.get("identified")
            and item.get("quantity") == "decode"}


def _single_era(dataset: Dataset, scope: ScopeRows, overlays: dict[str, Any]) -> dict[str, float] | None:
    """The era values a family or device scope starts from when every run it is fitted on is of one era with an
    overlay for its device kind (None otherwise, and for the engine scope)."""
    if scope.scope == "engine":
        return None
    eras, kinds = set(), set()
    for quantity in QUANTITIES:
        meta = dataset.blocks[quantity].meta
        rows = scope.masks[quantity] & dataset.blocks[quantity].fittable
        eras |= {str(e) if isinstance(e, str) else None for e in meta["era"].to_numpy()[rows]}
        kinds |= set(meta["kind"].to_numpy()[rows])
    if len(eras) != 1 or len(kinds) != 1 or None in eras:
        return None
    entry = ((overlays.get(next(iter(eras))) or {}).get("kinds") or {}).get(next(iter(kinds))) or {}
    values = {name: float(item["value"]) for name, item in entry.items()
              if isinstance(item, dict) and "value" in item and item.get("identified", True)}
    return values or None


def _fit_scope(dataset: Dataset, table: dict[str, Any], eng: dict[str, Any], engine: str, scope: ScopeRows,
               prior: Coefficients | None, n_boot: int, rng: np.random.Generator,
               masks: dict[str, np.ndarray] | None, era_values: dict[str, float] | None = None) -> None:
    """Fit one scope's quantities from its parent's values (overlaid with ``era_values``) and store it."""
    family = _device_family(dataset, scope.scope[7:]) if scope.scope.startswith("device:") else None
    label = {"engine": "engine default", "family": "engine scope", "device": "family scope"}[scope.scope.split(":")[0]]
    entry: dict[str, Any] = {}
    parent = _parent_values(table, engine, scope.scope, family, prior,
                            scope.scope[7:] if scope.scope.startswith("device:") else None)
    if era_values:
        parent.update({k: v for k, v in era_values.items() if k in parent})
        label += " and build era"
    for quantity in QUANTITIES:
        fitted = fit_scope_quantity(dataset.blocks[quantity], scope.masks[quantity], parent,
                                    n_boot=n_boot, rng=rng, scope_label=label)
        entry.update(fitted)
        parent.update({name: item["value"] for name, item in fitted.items()})
    if not entry:
        return
    if scope.scope.startswith("device:"):
        entry.update(host_figures(dataset, engine, scope.scope[7:], masks))
        entry.update(vllm_cpu_worker(dataset, engine, scope.scope[7:], masks))
    if scope.scope == "engine":
        eng["default"] = entry
    elif scope.scope.startswith("family:"):
        eng["families"][scope.scope[7:]] = entry
    else:
        eng["devices"][scope.scope[7:]] = entry


