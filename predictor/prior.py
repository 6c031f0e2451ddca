"""The physics prior: coefficients for a device nobody measured, from what is known about it.

A device with no runs and no measured family (memory type / architecture) would otherwise take the engine
scope, an average over whatever GPUs were measured. Two coefficients follow the hardware's figures in the
measured devices, and the prior predicts them from those figures instead
(``calibration.overlays.fit_physics_prior`` fits it per device kind; ``engines.<engine>.physics`` in the table):

- ``decode_bw_efficiency``: the share of peak bandwidth the decode kernels reach is capped by what each compute
  unit keeps in flight. By Little's law a GPU sustains at most (bytes in flight per SM) / (latency) per SM, so a
  kernel whose SMs can each keep ``c`` bytes moving per clock cycle reaches ``c x SMs x clock``: a device whose peak
  needs more bytes per SM per cycle (``Device.bytes_per_unit_cycle``: A100 13.4, H100 PCIe 10.0, V100 8.2, RTX 4090
  3.1) cannot reach its peak with llama.cpp's batch-1 kernels (A100, H100: 0.5-0.67 of peak) while the GDDR cards,
  with more SMs per byte, reach 0.8-1.0. Prior: ``min(cap, c / b)``, ``b`` the device's bytes per unit per cycle,
  ``cap`` and ``c`` fitted by least squares in log space over the kind's measured devices, ``c`` the smallest value
  the fit allows (a kind none of whose measured devices is limited gives the largest ``c`` none of them
  contradicts). A device without unit and clock figures takes the median of the measured devices of its memory
  class (:func:`memory_class`), else of all devices of the kind.
- ``prefill_compute_efficiency``: the share of the matmul peak prefill reaches is capped the same way by what each
  compute unit issues per cycle: llama.cpp's kernels reach about 1,000 FLOP per SM per cycle on every NVIDIA
  GPU measured, the whole FP16 tensor peak of a GeForce Ampere or Ada SM (1,024) but half an A100's (2,048) and a
  quarter of an H100's (3,779; measured 0.43-0.51 and 0.27 of peak). Prior: ``min(cap, c / f)``, ``f`` the
  device's matmul peak per compute unit per clock cycle, fitted as the decode limit. A device without unit and
  clock figures takes the older rule: the efficiency falls as the device's ratio of FLOPS to bandwidth rises,
  ``exp(a + b * ln(TFLOPS / (GB/s)))``, least squares in log space over the kind's measured devices, the slope at
  most 0 and the ratio clipped to the range those devices span.

Every other coefficient stays the engine scope's. The table's ``physics`` entry names the devices each prior
came from and its error band: the p90 error of leave-one-family-out predictions made through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from predictor.registry import REGISTRY

PRIOR_TERMS = ("decode_bw_efficiency", "prefill_compute_efficiency", "decode_fixed_ms", "decode_fixed_per_layer_us",
               "decode_moe_per_layer_us")


def memory_class(memory_type: str | None) -> str:
    """hbm, gddr, lpddr or other, from a catalogue memory type (HBM3e, GDDR6X, LPDDR5X, ...)."""
    text = str(memory_type or "").lower()
    for prefix in ("hbm", "gddr", "lpddr"):
        if text.startswith(prefix):
            return prefix
    return "other"


def flops_per_byte(tflops: float | None, bandwidth_gbs: float | None) -> float | None:
    """TFLOPS per GB/s (= 1e3 FLOP per byte): the ratio the prefill prior follows."""
    if not tflops or not bandwidth_gbs or tflops <= 0 or bandwidth_gbs <= 0:
        return None
    return float(tflops) / float(bandwidth_gbs)


def unit_limited_efficiency(cap: float, bytes_per_cycle: float, bytes_per_unit_cycle: float) -> float:
    """The bandwidth efficiency a device reaches when each compute unit moves at most ``bytes_per_cycle`` bytes
    per clock cycle: ``min(cap, bytes_per_cycle / bytes_per_unit_cycle)`` (the device's peak needs
    ``bytes_per_unit_cycle``)."""
    return min(float(cap), float(bytes_per_cycle) / float(bytes_per_unit_cycle))


def flops_per_unit_cycle(device: Any, engine: str) -> float | None:
    """The device's matmul peak for ``engine`` per compute unit per clock cycle (FLOP); None without the figures."""
    tflops = device.matmul_tflops(engine) if device is not None else None
    units, clock = getattr(device, "compute_units", None), getattr(device, "boost_clock_mhz", None)
    if not tflops or not units or not clock:
        return None
    return float(tflops) * 1e12 / (float(units) * float(clock) * 1e6)


def knee_factor(knee: float | None, flops_per_cycle: float | None) -> float:
    """How much of an era's prefill efficiency a device keeps when the era's kernels issue at most what a unit of
    ``knee`` FLOP per cycle does at that efficiency: ``min(1, knee / f)`` (1 without a knee or the device's f)."""
    if not knee or not flops_per_cycle:
        return 1.0
    return min(1.0, float(knee) / float(flops_per_cycle))


def prior_values(entry: Mapping[str, Any], memory_type: str | None, tflops: float | None,
                 bandwidth_gbs: float | None, bytes_per_unit_cycle: float | None = None,
                 unit_cycles_per_s: float | None = None, eras_apply: bool = False) -> dict[str, float]:
    """The prior's values for one device from a kind's ``physics`` entry (empty where it has no figure).
    ``unit_cycles_per_s``: compute units x clock (Hz), which turns ``tflops`` into FLOP per unit per cycle;
    ``eras_apply``: the device runs the eras' kernels (CUDA graphs), so it takes the entry's ``fixed_times``."""
    out: dict[str, float] = {}
    if eras_apply:
        out.update({name: float(item["value"]) for name, item in (entry.get("fixed_times") or {}).items()})
    bw = entry.get("decode_bw_efficiency") or {}
    limit = bw.get("unit_limit") or {}
    by_class = bw.get("by_memory_class") or {}
    cls = by_class.get(memory_class(memory_type)) or bw.get("all")
    if limit.get("cap") is not None and bytes_per_unit_cycle:
        out["decode_bw_efficiency"] = unit_limited_efficiency(limit["cap"], limit["bytes_per_cycle"],
                                                              bytes_per_unit_cycle)
    elif isinstance(cls, Mapping) and cls.get("value") is not None:
        out["decode_bw_efficiency"] = float(cls["value"])
    fl = entry.get("prefill_compute_efficiency") or {}
    ratio = flops_per_byte(tflops, bandwidth_gbs)
    flops_limit = fl.get("unit_limit") or {}
    if flops_limit.get("cap") is not None and tflops and unit_cycles_per_s:
        out["prefill_compute_efficiency"] = unit_limited_efficiency(
            flops_limit["cap"], flops_limit["flops_per_cycle"], float(tflops) * 1e12 / float(unit_cycles_per_s))
    elif ratio is not None and fl.get("log_intercept") is not None:
        low, high = REGISTRY["prefill_compute_efficiency"].bounds  # the range a fitted value may take
        if fl.get("ratio_range"):  # no extrapolation beyond the devices the prior was fitted on
            ratio = min(max(ratio, float(fl["ratio_range"][0])), float(fl["ratio_range"][1]))
        value = math.exp(float(fl["log_intercept"]) + float(fl["log_slope"]) * math.log(ratio))
        out["prefill_compute_efficiency"] = min(max(value, low), high)
    return out
