"""The predictor's features for every observation, computed by the predictor's own code.

Each observation (see :mod:`calibration.observations`) is turned back into the predictor's inputs: the
run's architecture (catalogue model with the run's overrides, rebuilt by
:func:`harness.synthetic.resolve_arch`), its quant and KV dtype, the device (catalogue GPU, or for
``device == "cpu"`` the host with the bandwidth and FLOPS the harness measured and stored in
provenance), context, engine options and offload.

The analytical model is linear in its coefficients once efficiencies are written as their inverse:
decode step time = offset + fixed_ms * 1e-3 + per_layer_us * 1e-6 * L + (bytes / BW) / eta_bw + ...
So a feature is the quantity :func:`predictor.estimate.evaluate` returns when one coefficient is set to
its unit value and every fitted coefficient is neutral (additive ones 0, efficiencies infinite). Every
formula therefore comes from ``predictor/memory.py`` and ``predictor/throughput.py`` through
``evaluate``; nothing is derived again here. Units: seconds for times, bytes for memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from predictor import memory as mem
from predictor.architecture import ModelArch
from predictor.coefficients import COEFFICIENT_NAMES, ENGINE_DEFAULTS
from predictor.devices import cpu_device, resolve_device
from predictor.engines import traits
from predictor.errors import BenchcalError
from predictor.estimate import evaluate
from predictor.registry import FIT_TERMS, REGISTRY
from predictor.scenario import DEFAULT_HOST_MEMORY_GIB, Scenario, scenario_inputs

NEUTRAL_INVERSE = 1e200  # an efficiency this large removes its term (bytes / (eta * BW) ~ 0)


@dataclass(frozen=True)
class Term:
    """A fitted coefficient as a linear term: weight = value (additive) or 1 / value (inverse)."""

    name: str
    inverse: bool

    @property
    def neutral(self) -> float:
        return NEUTRAL_INVERSE if self.inverse else 0.0

    def weight(self, value):
        """Linear weight of the coefficient value (array or scalar)."""
        value = np.asarray(value, dtype=float)
        return 1.0 / value if self.inverse else value

    def value(self, weight):
        """Coefficient value of a linear weight."""
        weight = np.asarray(weight, dtype=float)
        with np.errstate(divide="ignore"):
            return 1.0 / weight if self.inverse else weight


# Which evaluate() output each quantity is, and the coefficients that enter it linearly.
QUANTITY_OUTPUT = {"decode": "decode_step_s", "prefill": "prefill_s", "memory": "total_bytes"}
QUANTITY_TERMS: dict[str, tuple[Term, ...]] = {
    quantity: tuple(Term(name, REGISTRY[name].inverse) for name in names) for quantity, names in FIT_TERMS.items()
}


# ------------------------------------------------------------------------------------ run -> inputs


@lru_cache(maxsize=256)
def run_arch(model: str, overrides_json: str = "") -> ModelArch:
    """The architecture a run measured: the catalogue model with the run's overrides applied."""
    from harness.synthetic import resolve_arch

    overrides = json.loads(overrides_json) if overrides_json else None
    return resolve_arch(model, overrides)


def _cpu_figures(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """Host bandwidth (GB/s), matmul rate (TFLOPS: the engine's F16 probe, ``harness.hostbench``) and memory
    (GiB) the harness measured for a CPU run."""
    bw = row.get("host_bandwidth_gbs")
    gflops = row.get("host_matmul_gflops")
    if not _finite(bw) or not _finite(gflops):
        raise BenchcalError(f"CPU run {row.get('id')} has no probed host bandwidth/matmul rate in its provenance")
    memory_gib = row.get("host_memory_gib")
    return float(bw), float(gflops) / 1000.0, float(memory_gib) if _finite(memory_gib) else DEFAULT_HOST_MEMORY_GIB


def _finite(value: Any) -> bool:
    try:
        return value is not None and bool(np.isfinite(float(value)))
    except (TypeError, ValueError):
        return False


def run_device(row: Mapping[str, Any]):
    """The predictor's Device for a run: the catalogue GPU, or the measured host for ``cpu``."""
    if str(row.get("device")) == "cpu":
        bw, tflops, memory_gib = _cpu_figures(row)
        return cpu_device(bandwidth_gbs=bw, tflops=tflops, memory_gib=memory_gib,
                          device_id=str(row.get("host_id") or "cpu"))
    return resolve_device(str(row.get("device")))


def _nan(value: Any) -> float:
    return float(value) if _finite(value) else float("nan")


def row_inputs(row: Mapping[str, Any]) -> dict[str, Any]:
    """``evaluate`` keyword arguments (scalars) for one observation, plus its grouping keys: the run's
    :class:`~predictor.scenario.Scenario` translated by :func:`predictor.scenario.scenario_inputs`, the function
    ``predict`` uses, with the run's own weights size where it was recorded."""
    engine = str(row["engine"])
    arch = run_arch(str(row["model"]), str(row.get("arch_overrides") or ""))
    device = run_device(row)
    weights = row.get("weights_bytes")
    host_bw = row.get("host_bandwidth_gbs") if device.kind == "gpu" else None  # a CPU device has its own
    scenario = Scenario(
        model=arch, device=device, engine=engine, quant=str(row.get("quant") or traits(engine).default_quant),
        kv_dtype=str(row.get("kv_dtype") or "f16"), context=float(row["context"]), batch=float(row.get("batch") or 1),
        device_count=float(row.get("device_count") or 1), offload_fraction=float(row.get("offload_fraction") or 0.0),
        flash_attn=bool(row.get("flash_attn")), n_ubatch=float(row.get("n_ubatch") or 512),
        prompt_depth=float(row["prompt_depth"]) if _finite(row.get("prompt_depth")) else 0.0,
        host_bandwidth_gbs=float(host_bw) if _finite(host_bw) else None,
        host_memory_gib=float(row["host_memory_gib"]) if _finite(row.get("host_memory_gib")) else None,
        weights_bytes=float(weights) if _finite(weights) and float(weights) > 0 else None,
        backend=str(row["backend"]) if isinstance(row.get("backend"), str) and row.get("backend") else None,
        logits_all=row.get("logits_all") is True,
        engine_build=str(row["engine_version"]) if isinstance(row.get("engine_version"), str) else None,
    )
    inputs = scenario_inputs(scenario, arch, device, engine)
    kwargs = dict(inputs.kwargs)
    kwargs["bits_per_weight"] = _nan(kwargs["bits_per_weight"])
    kwargs["exact_weights_bytes"] = _nan(kwargs["exact_weights_bytes"])
    return {"arch": arch, "engine": engine, "device_id": device.id, "family": device.family, **kwargs,
            "cublas_dequant": row.get("quantized_matmul") == "cublas-fp16" or bool(kwargs.get("cublas_dequant"))}


ARRAY_INPUTS = ("memory_gib", "usable_gib", "bandwidth_gbs", "tflops", "bits_per_weight", "exact_weights_bytes",
                "kv_bytes_per_element", "context", "batch", "device_count", "offload_fraction", "flash_attn",
                "cpu_repack", "cpu_repack_weights", "cpu_float_weights", "cpu_q8_weights", "cpu_generic_bytes", "kquant_low_weights", "n_ubatch", "cublas_dequant", "host_bandwidth_gbs", "host_memory_gib", "prompt_depth",
                "expert_tile", "logits_all")


@dataclass
class Inputs:
    """Per-observation predictor inputs: a list of dicts plus the rows that could not be rebuilt."""

    rows: list[dict[str, Any] | None]
    problems: dict[int, str]


def frame_inputs(frame: pd.DataFrame) -> Inputs:
    """:func:`row_inputs` for every row; rows whose model/device/quant cannot be resolved are None."""
    rows: list[dict[str, Any] | None] = []
    problems: dict[int, str] = {}
    for i, (_, row) in enumerate(frame.iterrows()):
        try:
            rows.append(row_inputs(row))
        except BenchcalError as exc:
            rows.append(None)
            problems[i] = str(exc)
    return Inputs(rows, problems)


def _groups(inputs: Inputs) -> dict[tuple, list[int]]:
    """Positions of rows that one vectorized ``evaluate`` call can serve (same arch, engine, quant kind)."""
    groups: dict[tuple, list[int]] = {}
    for i, spec in enumerate(inputs.rows):
        if spec is None:
            continue
        key = (id(spec["arch"]), spec["engine"], spec["bits_per_weight_non_expert"])
        groups.setdefault(key, []).append(i)
    return groups


def evaluate_rows(inputs: Inputs, coefficients: Mapping[str, np.ndarray], prompt_tokens: np.ndarray,
                  outputs: tuple[str, ...] = ("decode_step_s", "prefill_s", "total_bytes")) -> dict[str, np.ndarray]:
    """Run :func:`predictor.estimate.evaluate` for every row with per-row coefficients.

    ``coefficients`` maps each coefficient name to an array (one value per row); ``prompt_tokens`` is
    the prompt length of each row (the decode context for decode rows). Rows without inputs give NaN.
    """
    n = len(inputs.rows)
    out = {name: np.full(n, np.nan) for name in outputs}
    prompts = np.asarray(prompt_tokens, dtype=float)
    for (_arch_id, engine, bpw_ne), positions in _groups(inputs).items():
        idx = np.asarray(positions)
        specs = [inputs.rows[i] for i in positions]
        kwargs = {name: np.asarray([s[name] for s in specs]) for name in ARRAY_INPUTS}
        exact = kwargs.pop("exact_weights_bytes")
        if np.all(np.isfinite(exact)):
            kwargs["exact_weights_bytes"] = exact
        elif np.any(np.isfinite(exact)):
            bpw = kwargs["bits_per_weight"]
            estimate = mem.weights_bytes(specs[0]["arch"], bpw, bpw_ne)
            kwargs["exact_weights_bytes"] = np.where(np.isfinite(exact), exact, estimate)
        coeffs = {name: np.asarray(coefficients[name], dtype=float)[idx] for name in COEFFICIENT_NAMES}
        with np.errstate(all="ignore"):  # probes with neutral coefficients give zero times
            result = evaluate(
                specs[0]["arch"], engine, coeffs, kind=np.asarray([s["kind"] for s in specs]),
                bits_per_weight_non_expert=bpw_ne, prompt_tokens=np.maximum(prompts[idx], 1.0),
                with_max_context=False, **kwargs,
            )
        for name in outputs:
            out[name][idx] = np.broadcast_to(result[name], idx.shape)
    return out


def default_coefficients(engines: list[str]) -> dict[str, np.ndarray]:
    """Engine defaults as per-row arrays."""
    return {name: np.asarray([ENGINE_DEFAULTS[e][name][0] for e in engines], dtype=float)
            for name in COEFFICIENT_NAMES}


# --------------------------------------------------------------------------------------- features


@dataclass
class Features:
    """Linear features of one quantity: ``offset`` (n,) and one column per term in ``x`` (n, k).

    prediction = offset + sum_j weight_j * x[:, j] for decode and memory; for prefill the terms
    ``decode_bw_efficiency`` and ``prefill_compute_efficiency`` combine as max(w_bw x_bw, w_fl x_fl)
    (each ubatch is bandwidth or compute bound, as in ``throughput.prefill_seconds``).
    """

    quantity: str
    terms: tuple[Term, ...]
    offset: np.ndarray
    x: np.ndarray
    valid: np.ndarray

    def column(self, name: str) -> np.ndarray:
        return self.x[:, [t.name for t in self.terms].index(name)]

    def take(self, rows: np.ndarray) -> Features:
        """The features of ``rows`` (indices, repeats allowed: a bootstrap resample), in that order."""
        return Features(self.quantity, self.terms, self.offset[rows], self.x[rows], self.valid[rows])


def _prompt_column(frame: pd.DataFrame, quantity: str) -> np.ndarray:
    if quantity == "decode":
        return frame["decode_context"].to_numpy(dtype=float)
    if quantity == "prefill":
        return frame["prompt_tokens"].to_numpy(dtype=float)
    return np.ones(len(frame))


def quantity_features(frame: pd.DataFrame, quantity: str, inputs: Inputs | None = None) -> Features:
    """Probe ``evaluate`` to get the offset and one feature column per fitted term of ``quantity``."""
    terms = QUANTITY_TERMS[quantity]
    output = QUANTITY_OUTPUT[quantity]
    inputs = inputs or frame_inputs(frame)
    engines = [spec["engine"] if spec else "llama.cpp" for spec in inputs.rows]
    prompts = _prompt_column(frame, quantity)
    neutral = default_coefficients(engines)
    for term in terms:
        neutral[term.name] = np.full(len(engines), term.neutral)
    offset = evaluate_rows(inputs, neutral, prompts, (output,))[output]
    columns = []
    for term in terms:
        probe = dict(neutral)
        probe[term.name] = np.ones(len(engines))
        columns.append(evaluate_rows(inputs, probe, prompts, (output,))[output] - offset)
    x = np.column_stack(columns) if columns else np.zeros((len(engines), 0))
    valid = np.isfinite(offset) & np.all(np.isfinite(x), axis=1)
    return Features(quantity, terms, offset, x, valid)


def combine(features: Features, weights: np.ndarray) -> np.ndarray:
    """The quantity predicted from features and per-row linear weights (n, k)."""
    contributions = features.x * weights
    if features.quantity != "prefill":
        return features.offset + contributions.sum(axis=1)
    names = [t.name for t in features.terms]
    bw, fl = names.index("decode_bw_efficiency"), names.index("prefill_compute_efficiency")
    rest = [j for j in range(len(names)) if j not in (bw, fl)]
    return features.offset + contributions[:, rest].sum(axis=1) + np.maximum(contributions[:, bw], contributions[:, fl])
