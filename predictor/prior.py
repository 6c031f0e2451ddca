"""The physics prior: coefficients for a device nobody measured, from what is known about it.

A device with no runs and no measured family (memory type / architecture) would otherwise take the engine
scope, an average over whatever GPUs were measured. Two coefficients follow the hardware's figures in the
measured devices, and the prior predicts them from those figures instead
(``calibration.overlays.fit_physics_prior`` fits it per device kind; ``engines.<engine>.physics`` in the table):

- ``decode_bw_efficiency``: the share of peak bandwidth the decode kernels reach depends on the memory system.
  llama.cpp's batch-1 kernels keep too few bytes in flight to fill HBM stacks (A100, H100: 0.5-0.67 of peak)
  while GDDR and LPDDR parts reach 0.8-1.0. Prior: the median over the measured devices of the same memory
  class (:func:`memory_class`), else over all devices of the kind.
- ``prefill_compute_efficiency``: the share of the matmul peak prefill reaches falls as the device's ratio of
  FLOPS to bandwidth rises (the quantized tiles must still be read and unpacked). Prior: ``exp(a + b *
  ln(TFLOPS / (GB/s)))``, least squares in log space over the kind's measured devices, the slope at most 0
  and the ratio clipped to the range those devices span.

Every other coefficient stays the engine scope's. The table's ``physics`` entry names the devices each prior
came from and its error band: the p90 error of leave-one-family-out predictions made through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from predictor.registry import REGISTRY

PRIOR_TERMS = ("decode_bw_efficiency", "prefill_compute_efficiency")


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


def prior_values(entry: Mapping[str, Any], memory_type: str | None, tflops: float | None,
                 bandwidth_gbs: float | None) -> dict[str, float]:
    """The prior's values for one device from a kind's ``physics`` entry (empty where it has no figure)."""
    out: dict[str, float] = {}
    bw = entry.get("decode_bw_efficiency") or {}
    by_class = bw.get("by_memory_class") or {}
    cls = by_class.get(memory_class(memory_type)) or bw.get("all")
    if isinstance(cls, Mapping) and cls.get("value") is not None:
        out["decode_bw_efficiency"] = float(cls["value"])
    fl = entry.get("prefill_compute_efficiency") or {}
    ratio = flops_per_byte(tflops, bandwidth_gbs)
    if ratio is not None and fl.get("log_intercept") is not None:
        low, high = REGISTRY["prefill_compute_efficiency"].bounds  # the range a fitted value may take
        if fl.get("ratio_range"):  # no extrapolation beyond the devices the prior was fitted on
            ratio = min(max(ratio, float(fl["ratio_range"][0])), float(fl["ratio_range"][1]))
        value = math.exp(float(fl["log_intercept"]) + float(fl["log_slope"]) * math.log(ratio))
        out["prefill_compute_efficiency"] = min(max(value, low), high)
    return out
