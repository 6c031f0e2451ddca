"""Fitting the analytical model's coefficients to observations: bounded, robust, relative least squares.

Each quantity is linear in its coefficients (see :mod:`calibration.features`), so a fit is a
non-negative (bounded) least-squares problem on relative errors: rows are divided by the measured
value, so a 5% miss on a 10 ms step weighs as much as a 5% miss on a 100 ms step. Robustness: one
refit after trimming points whose relative residual exceeds ``TRIM_MADS`` robust standard deviations
(never more than ``MAX_TRIM_SHARE`` of the points). Bounds keep every coefficient physical
(efficiencies in (0, 1] of a spec-sheet peak; fixed terms non-negative).

Identifiability guard: a term is fitted only when the data can tell it apart from the others
(enough points, a well-conditioned design); otherwise it is held at the parent scope's value
(device -> family -> engine -> engine default) and reported as not identified. Prefill combines the
bandwidth-bound and compute-bound branch per ubatch with ``max``, as ``throughput.prefill_seconds``
does: the fit classifies each point with the current estimate and iterates until stable.

Scikit-learn API: :class:`TermRegressor` is an estimator (``fit(X, y)`` / ``predict(X)``, parameters as
plain attributes) over a :class:`calibration.features.Features` block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import lsq_linear
from sklearn.base import BaseEstimator, RegressorMixin

from calibration.features import Features, Term, combine
from predictor.registry import REGISTRY

MAX_CONDITION = 30.0  # column-normalized condition number above which a design is called degenerate
TRIM_MADS = 4.0
MIN_TRIM_REL = 0.10  # never trim points closer than 10% to the fit
MAX_TRIM_SHARE = 0.2
PREFILL_ITERATIONS = 12

# Physical bounds of each coefficient's value: (lower, upper) for GPUs, and for the host CPU where the
# reference figure is a measured copy bandwidth / BLAS FLOPS rather than a spec-sheet peak (a decode
# that only reads can beat a copy; quantized int8 dot products can beat fp32 BLAS). Prefill may exceed
# the device's matmul peak (``Device.matmul_tflops``: FP16 with FP16 accumulate for llama.cpp) up to 2x:
# llama.cpp's int8 MMQ kernels run at twice that rate. The KV read efficiency stays at most 1 although
# llama.cpp without flash attention re-reads each K/V row once per query head (caches serve part of those
# reads): the same coefficient serves flash attention, which reads each row once, from DRAM.
BOUNDS: dict[str, tuple[float, float]] = {c.name: c.bounds for c in REGISTRY.values() if c.bounds is not None}
CPU_UPPER = {c.name: c.cpu_upper for c in REGISTRY.values() if c.cpu_upper is not None}
# When the design is degenerate, drop these first (kept last: the efficiencies, the physics).
DROP_ORDER = ("decode_kquant_flops_per_weight", "decode_fixed_per_layer_us", "decode_moe_per_layer_us", "decode_kv_efficiency", "decode_kv_reread", "decode_generic_flops_per_byte",
              "decode_dequant_flops_per_byte",
              "host_bw_efficiency", "prefill_unpack_flops_per_weight", "prefill_generic_flops_per_weight",
              "prefill_q8_flops_per_weight", "prefill_expert_vecdot_flops_per_weight",
              "prefill_dequant_bytes_per_weight", "prefill_attn_efficiency", "prefill_scores_efficiency",
              "prefill_fixed_ms", "decode_fixed_ms", "compute_buffer_scale", "runtime_fixed_gib",
              "prefill_f16_efficiency", "prefill_compute_efficiency", "decode_bw_efficiency")


def weight_bounds(term: Term, cpu: bool) -> tuple[float, float]:
    """Bounds of a term's linear weight from the bounds of its value."""
    low, high = BOUNDS[term.name]
    if cpu:
        high = CPU_UPPER.get(term.name, high)
    if term.inverse:
        return 1.0 / high, 1.0 / low
    return low, high


def condition_number(a: np.ndarray) -> float:
    """Condition number of ``a`` with unit-norm columns (inf for a zero or repeated column)."""
    if a.shape[1] == 0:
        return 1.0
    norms = np.linalg.norm(a, axis=0)
    if np.any(norms == 0):
        return float("inf")
    s = np.linalg.svd(a / norms, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else float("inf")


@dataclass
class LinearFit:
    """Result of one fit: weights for every term, which were fitted, and how many points were used."""

    weights: np.ndarray
    fitted: np.ndarray
    n_points: int
    n_trimmed: int = 0
    used: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


def _design(features: Features, rows: np.ndarray, weights: np.ndarray, free: np.ndarray,
            compute_bound: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(A, known) such that prediction = known + A @ w_free for the rows (prefill: given the branch)."""
    x = features.x[rows].copy()
    if compute_bound is not None:
        names = [t.name for t in features.terms]
        bw, fl = names.index("decode_bw_efficiency"), names.index("prefill_compute_efficiency")
        x[:, bw] = np.where(compute_bound, 0.0, x[:, bw])
        x[:, fl] = np.where(compute_bound, x[:, fl], 0.0)
    known = features.offset[rows] + x[:, ~free] @ weights[~free]
    return x[:, free], known


def _solve(a: np.ndarray, known: np.ndarray, y: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Bounded least squares on relative errors: minimize sum(((known + a w) / y - 1)^2)."""
    if a.shape[1] == 0:
        return np.zeros(0)
    result = lsq_linear(a / y[:, None], (y - known) / y, bounds=(low, high), method="bvls")
    return result.x


NEGLIGIBLE_SHARE = 1e-6  # a term whose unit contribution is below this share of every target does not act


def acts_on(features: Features, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(rows, terms): whether each term acts on each row (contributes more than rounding noise at unit weight)."""
    return np.abs(features.x[rows]) / np.abs(y)[:, None] > NEGLIGIBLE_SHARE


def acting_terms(features: Features, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which terms act on any of these rows."""
    return np.any(acts_on(features, rows, y), axis=0)


def _identifiable(features: Features, rows: np.ndarray, y: np.ndarray, candidates: list[int], min_points: int,
                  max_condition: float) -> list[int]:
    """The largest subset of ``candidates`` the rows can identify.

    When the design is degenerate, drop the first term in ``DROP_ORDER`` whose removal alone makes it
    identifiable (two columns that move together, like the bandwidth and unpacking terms of runs that all
    use quantized formats, cost one of them, not every term ahead of it in the order); when no single removal
    does, drop the first in the order and look again.
    """
    names = [t.name for t in features.terms]
    acting = acting_terms(features, rows, y)
    keep = [j for j in candidates if acting[j]]
    n_points = len(np.unique(rows))

    def identifiable(subset: list[int]) -> bool:
        return (n_points >= max(min_points, len(subset) + 1)
                and condition_number(features.x[rows][:, subset]) <= max_condition)

    while keep:
        if identifiable(keep):
            return keep
        order = sorted(keep, key=lambda j: DROP_ORDER.index(names[j]) if names[j] in DROP_ORDER else 99)
        single = next((j for j in order if identifiable([k for k in keep if k != j])), order[0])
        keep = [k for k in keep if k != single]
    return []


def _told_apart_nowhere(features: Features, rows: np.ndarray, y: np.ndarray) -> tuple[str, ...]:
    """Terms only a kind of run the scope lacks can tell apart: the KV cache's first read is measured alone only
    by runs that read each row once (flash attention, vLLM); where every run also re-reads the rows once per
    query head, splitting the KV time between the first read and the re-reads would rest on the group size
    alone, so the first read's efficiency comes from the parent scope."""
    names = [t.name for t in features.terms]
    if "decode_kv_efficiency" not in names or "decode_kv_reread" not in names:
        return ()
    acts = acts_on(features, rows, y)
    first, reread = acts[:, names.index("decode_kv_efficiency")], acts[:, names.index("decode_kv_reread")]
    return ("decode_kv_efficiency",) if first.any() and not np.any(first & ~reread) else ()


def fit_terms(features: Features, rows: np.ndarray, y: np.ndarray, parent_weights: np.ndarray,
              *, cpu: bool = False, held: tuple[str, ...] = (), min_points: int = 3,
              max_condition: float = MAX_CONDITION, trim: bool = True, fixed_set: list[int] | None = None) -> LinearFit:
    """Fit the identifiable terms of ``features`` on ``rows`` (indices) against ``y`` (same length as rows).

    ``parent_weights``: the weight of every term at the parent scope (used for held terms and as the
    starting point). ``held``: names never fitted here. ``fixed_set``: fit exactly these term indices
    (bootstrap refits reuse the set chosen on the full data).
    """
    names = [t.name for t in features.terms]
    bounds = [weight_bounds(t, cpu) for t in features.terms]
    weights = np.asarray(parent_weights, dtype=float).copy()
    unseparable = _told_apart_nowhere(features, rows, y)
    candidates = [j for j, name in enumerate(names) if name not in held and name not in unseparable]
    chosen = (fixed_set if fixed_set is not None
              else _identifiable(features, rows, y, candidates, min_points, max_condition))
    free = np.zeros(len(names), bool)
    free[chosen] = True
    profile = _profile_terms(features, weights, free)
    used = np.ones(len(rows), bool)
    n_trimmed = 0
    for attempt in range(2 if trim else 1):
        sub, y_sub = rows[used], y[used]
        weights = _fit_once(features, sub, y_sub, weights, free, bounds)
        if attempt == 1 or not trim or len(sub) < 6:
            break
        rel = combine_rows(features, rows, weights) / y - 1.0
        mad = np.median(np.abs(rel - np.median(rel))) * 1.4826
        limit = max(TRIM_MADS * mad, MIN_TRIM_REL)
        outliers = np.abs(rel) > limit
        if not outliers.any() or outliers.sum() > MAX_TRIM_SHARE * len(rows):
            break
        used = ~outliers
        n_trimmed = int(outliers.sum())
    if profile is not None:  # the per-layer part was fitted too, as the profile's share
        free[profile[1]] = True
    return LinearFit(weights, free, int(used.sum()), n_trimmed, used)


def combine_rows(features: Features, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Predicted quantity for ``rows`` with one weight vector for all of them."""
    sub = Features(features.quantity, features.terms, features.offset[rows], features.x[rows], features.valid[rows])
    return combine(sub, np.broadcast_to(weights, sub.x.shape))


def _profile_terms(features: Features, start: np.ndarray, free: np.ndarray) -> tuple[int, int] | None:
    """(fixed, per-layer) positions when the decode fixed time is fitted without its per-layer part, which its runs
    cannot tell apart (all of one depth) while the parent has one: then the two are fitted as one scale on the
    parent's profile, ``a x (fixed + per_layer x L)``, so a model of another depth keeps the parent's shape (a
    negative step time beside the parent's per-layer one would give a 16-layer model none)."""
    names = [t.name for t in features.terms]
    if "decode_fixed_per_layer_us" not in names:
        return None
    fixed, per_layer = names.index("decode_fixed_ms"), names.index("decode_fixed_per_layer_us")
    if not free[fixed] or free[per_layer] or start[per_layer] <= 0 or start[fixed] < 0:
        return None
    return fixed, per_layer


def _fit_profile(features: Features, rows: np.ndarray, y: np.ndarray, start: np.ndarray, free: np.ndarray,
                 bounds: list[tuple[float, float]], fixed: int, per_layer: int) -> np.ndarray:
    """:func:`_fit_once` with the fixed time's column the parent's whole fixed-time profile and its weight a scale
    (at least 0) on it; returns the weights with both parts scaled."""
    profile = Features(features.quantity, features.terms, features.offset, features.x.copy(), features.valid)
    profile.x[:, fixed] = features.x[:, fixed] * start[fixed] + features.x[:, per_layer] * start[per_layer]
    profile.x[:, per_layer] = 0.0
    scaled_start = start.copy()
    scaled_start[fixed], scaled_start[per_layer] = 1.0, 0.0  # the per-layer part is in the profile column
    scaled_bounds = list(bounds)
    scaled_bounds[fixed] = (0.0, 1e6)
    weights = _fit_once(profile, rows, y, scaled_start, free, scaled_bounds)
    scale = weights[fixed]
    weights[fixed], weights[per_layer] = scale * start[fixed], scale * start[per_layer]
    return weights


def _fit_once(features: Features, rows: np.ndarray, y: np.ndarray, start: np.ndarray, free: np.ndarray,
              bounds: list[tuple[float, float]]) -> np.ndarray:
    pair = _profile_terms(features, start, free)
    if pair is not None:
        return _fit_profile(features, rows, y, start, free, bounds, *pair)
    low = np.array([b[0] for b, f in zip(bounds, free, strict=True) if f])
    high = np.array([b[1] for b, f in zip(bounds, free, strict=True) if f])
    weights = start.copy()
    weights[free] = np.clip(weights[free], low, high)
    if features.quantity != "prefill":
        a, known = _design(features, rows, weights, free, None)
        weights[free] = _solve(a, known, y, low, high)
        return weights
    names = [t.name for t in features.terms]
    bw, fl = names.index("decode_bw_efficiency"), names.index("prefill_compute_efficiency")
    previous = None
    for _ in range(PREFILL_ITERATIONS):
        compute_bound = weights[fl] * features.x[rows, fl] >= weights[bw] * features.x[rows, bw]
        if previous is not None and np.array_equal(compute_bound, previous):
            break
        a, known = _design(features, rows, weights, free, compute_bound)
        weights[free] = _solve(a, known, y, low, high)
        previous = compute_bound
    return weights


class TermRegressor(BaseEstimator, RegressorMixin):
    """Scikit-learn estimator over one :class:`Features` block (all rows, one coefficient set).

    ``fit(X, y)``: X is a Features block, y the measured quantity (seconds or bytes) per row.
    ``coef_`` holds the linear weights, ``values_`` the coefficient values, ``fitted_`` which terms
    were identified, ``n_trimmed_`` the outliers left out. ``parent_weights`` default to the engine defaults
    passed by the caller; ``fixed_set``: fit exactly these term indices (bootstrap refits). Every scope of the
    table (:mod:`calibration.table`), its bootstrap and the era values (:mod:`calibration.overlays`) are fitted
    through it, on ``Features.take(rows)`` of their rows.
    """

    def __init__(self, parent_weights=None, cpu: bool = False, held: tuple[str, ...] = (), min_points: int = 3,
                 max_condition: float = MAX_CONDITION, trim: bool = True, fixed_set=None):
        self.parent_weights = parent_weights
        self.cpu = cpu
        self.held = held
        self.min_points = min_points
        self.max_condition = max_condition
        self.trim = trim
        self.fixed_set = fixed_set

    def fit(self, X: Features, y) -> TermRegressor:
        y = np.asarray(y, dtype=float)
        rows = np.flatnonzero(X.valid & np.isfinite(y) & (y > 0))
        start = np.ones(len(X.terms)) if self.parent_weights is None else np.asarray(self.parent_weights, float)
        result = fit_terms(X, rows, y[rows], start, cpu=self.cpu, held=tuple(self.held),
                           min_points=self.min_points, max_condition=self.max_condition, trim=self.trim,
                           fixed_set=None if self.fixed_set is None else list(self.fixed_set))
        self.coef_ = result.weights
        self.fitted_ = result.fitted
        self.n_trimmed_ = result.n_trimmed
        self.values_ = {t.name: float(t.value(w)) for t, w in zip(X.terms, result.weights, strict=True)}
        self.n_points_ = result.n_points
        return self

    def predict(self, X: Features) -> np.ndarray:
        return combine(X, np.broadcast_to(self.coef_, X.x.shape))
