"""Vectorized sweeps: one model over many devices x quants x contexts x batches in one numpy pass.

Used by the leaderboard, the quantization matrix, recommendations and the speed benchmark
(benchmarks/bench_predictor.py). The formulas are the ones ``predict`` uses (``evaluate``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictor.architecture import ModelArch
from predictor.coefficients import COEFFICIENT_NAMES, Coefficients
from predictor.devices import Device
from predictor.engines import traits
from predictor.estimate import evaluate
from predictor.quants import QuantFormat, normalize_engine, resolve_kv_dtype
from predictor.scenario import (
    DEFAULT_HOST_BANDWIDTH_GBS,
    DEFAULT_PROMPT_TOKENS,
    Scenario,
    device_kwargs,
    scenario_arch,
)
from predictor.weights import format_bits, kernel_kwargs, known_weights_bytes


def coefficient_arrays(table: Coefficients, engine: str, devices: Sequence[Device]) -> dict[str, np.ndarray]:
    """Per-device coefficient arrays (device -> family -> engine -> default, as ``lookup``, with the newest era
    fitted for the device's kind, as ``predict`` by default)."""
    sets = [table.lookup(engine, d.id, d.family, table.newest_era(engine, d.kind), d.kind, d) for d in devices]
    return {name: np.array([s.values[name] for s in sets], dtype=float) for name in COEFFICIENT_NAMES}


def sweep_scenario(
    base: Scenario,
    devices: Sequence[Device],
    quants: Sequence[QuantFormat],
    contexts: Sequence[int],
    batches: Sequence[int] = (1,),
    *,
    table: Coefficients | None = None,
    with_max_context: bool = True,
) -> dict[str, np.ndarray]:
    """:func:`sweep` over the axes (devices, quants, contexts, batches), every other input from ``base``: its model,
    engine, KV dtype, device count, prompt, flash attention, micro-batch, offload and host bandwidth (its own
    device, quant, context and batch are the axes')."""
    engine = normalize_engine(base.engine)
    kv = resolve_kv_dtype(base.kv_dtype or traits(engine).default_kv_dtype, engine)
    return sweep(scenario_arch(base), engine, devices, quants, contexts, batches, table=table,
                 kv_bytes_per_element=kv.bytes_per_element, device_count=base.device_count,
                 prompt_tokens=base.prompt_tokens, flash_attn=base.flash_attn, n_ubatch=base.n_ubatch,
                 host_bandwidth_gbs=base.host_bandwidth_gbs or DEFAULT_HOST_BANDWIDTH_GBS,
                 offload_fraction=base.offload_fraction, with_max_context=with_max_context)


def sweep(
    arch: ModelArch,
    engine: str,
    devices: Sequence[Device],
    quants: Sequence[QuantFormat],
    contexts: Sequence[int],
    batches: Sequence[int] = (1,),
    *,
    table: Coefficients | None = None,
    kv_bytes_per_element: float = 2.0,
    device_count: int = 1,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    flash_attn: bool = True,
    n_ubatch: int = 512,
    host_bandwidth_gbs: float = DEFAULT_HOST_BANDWIDTH_GBS,
    offload_fraction: float = 0.0,
    with_max_context: bool = True,
) -> dict[str, np.ndarray]:
    """Evaluate every (device, quant, context, batch) cell; arrays of shape (D, Q, C, B).

    Each quant's weights are sized as ``predict`` sizes them (``known_weights_bytes``: the model's GGUF,
    llama-quantize's tensor types, else the format's average width).
    """
    table = table or Coefficients()
    D = len(devices)
    col = (slice(None), None, None, None)
    coeffs = {k: v[col] for k, v in coefficient_arrays(table, engine, devices).items()}
    per_device = [device_kwargs(d, engine) for d in devices]  # the same inputs predict() passes, one row per device
    dev = {key: np.array([kw[key] for kw in per_device])[col] for key in per_device[0]}
    q = (None, slice(None), None, None)
    bits = [format_bits(arch, qf, engine) for qf in quants]  # (experts, others), as predict() passes them
    bpw = np.array([expert for expert, _ in bits])[q]
    bpw_ne = None
    if any(other is not None for _, other in bits):
        # Formats that quantize every tensor use their own width for the non-expert part too.
        bpw_ne = np.array([expert if other is None else other for expert, other in bits])[q]
    known = [known_weights_bytes(arch, qf, engine)[0] for qf in quants]
    exact_weights_bytes = np.array([np.nan if b is None else b for b in known])[q]
    mixes = [kernel_kwargs(arch, qf.id) for qf in quants]
    kernel = {key: np.array([mix[key] for mix in mixes])[q] for key in mixes[0]}
    ctx = np.array(contexts, dtype=float)[None, None, :, None]
    bat = np.array(batches, dtype=float)[None, None, None, :]
    out = evaluate(
        arch, engine, coeffs, **dev,
        bits_per_weight=bpw, bits_per_weight_non_expert=bpw_ne, exact_weights_bytes=exact_weights_bytes,
        kv_bytes_per_element=kv_bytes_per_element, context=ctx, batch=bat,
        prompt_tokens=np.minimum(prompt_tokens, ctx), device_count=device_count,
        flash_attn=flash_attn, n_ubatch=n_ubatch, host_bandwidth_gbs=host_bandwidth_gbs,
        offload_fraction=offload_fraction, with_max_context=with_max_context, **kernel,
    )
    shape = (D, len(quants), len(contexts), len(batches))
    return {k: np.broadcast_to(v, shape) for k, v in out.items()}
