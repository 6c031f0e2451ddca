"""Engine coefficients: the named constants of the analytical model, and where each came from.

Every prediction uses one :class:`CoefficientSet` per (engine, device). Defaults live in
``ENGINE_DEFAULTS`` with their public source; a coefficients file written by ``benchcal calibrate``
overrides them, per device where that device was measured, else per device family
(``memory_type/architecture``), else per engine. A prediction says which scope it used.

Coefficients file (JSON)::

    {"schema_version": 1, "source": "...", "created_at": "...",
     "engines": {"llama.cpp": {"default": {NAME: VALUE | {"value": v, "uncertainty": u, ...}},
                               "families": {"hbm3e/hopper": {...}},
                               "devices": {"h200": {...}}}}}

Names and units (every coefficient is physical so a fitted table can be read):

- ``decode_fixed_ms``            fixed time per decode step, ms (sampling, graph launch, host sync)
- ``decode_fixed_per_layer_us``  fixed time per decode step per layer, microseconds (kernel launches)
- ``decode_bw_efficiency``       achieved / peak memory bandwidth while streaming the weights, 0-1
- ``decode_kv_efficiency``       achieved / peak memory bandwidth while attention reads the KV cache once, 0-1
- ``decode_kv_reread``           cost of each further read of a cached K/V row by another query head of its group
                                 (llama.cpp without flash attention), in peak-bandwidth bytes per byte: 1 / the
                                 KV efficiency when every re-read comes from DRAM, less where the GPU's cache holds
                                 the rows between the query heads (0-50)
- ``decode_dequant_flops_per_byte``  operations per byte of quantized weights unpacked in a decode step, at the
                                 device's peak FLOPS (unified-memory GPUs: Apple's ALUs run near their bandwidth
                                 limit; the CPU: its measured FP32 rate)
- ``decode_generic_flops_per_byte``  llama.cpp on a CPU: operations more per quantized byte on its generic dot
                                 products (Q5_0, Q6_K, ...: neither repacked nor Q8_0), at the probed matmul rate
- ``prefill_fixed_ms``           fixed time per prompt, ms
- ``prefill_dequant_bytes_per_weight``  device-memory traffic per quantized weight per ubatch when an old llama.cpp
                                 CUDA build dequantizes the weights to an FP16 buffer for cuBLAS (read quantized,
                                 write FP16, ...), bytes at peak bandwidth; current builds (MMQ) do not
- ``prefill_unpack_flops_per_weight``  operations per quantized weight and prompt token a unified-memory GPU spends
                                 unpacking weight tiles in its matmul kernels (Metal), at peak FLOPS; fitted per
                                 device and family only
- ``prefill_generic_flops_per_weight``  operations per weight and prompt token llama.cpp's generic CPU matmul path
                                 (quantized formats it does not repack into its GEMM layouts: Q5_0, Q6_K, ...)
                                 spends beyond the repacked kernels' rate, at the probed matmul rate; CPU only
- ``prefill_q8_flops_per_weight``  the same for Q8_0 weights, whose dot product unpacks no sub-block scales; CPU only
- ``prefill_compute_efficiency`` achieved / peak dense FP16 FLOPS for the weight matmuls, 0-1 (CPU: of the probed
                                 matmul rate, for the repacked and generic paths)
- ``prefill_f16_efficiency``     llama.cpp on a CPU: achieved / probed matmul rate for F16/BF16/F32 weights
                                 (llamafile's GEMM, the path the probe itself runs: near 1)
- ``prefill_attn_efficiency``    achieved / peak FLOPS for attention (grows with n^2), 0-1 (flash attention, vLLM)
- ``prefill_scores_efficiency``  achieved / peak bandwidth writing the f32 attention scores once, 0-1 (llama.cpp
                                 without flash attention: the scores go through memory several times)
- ``runtime_fixed_gib``          engine + driver context (CUDA context, allocator pools, interpreter on CPU), GiB
- ``compute_buffer_scale``       multiplier on the analytical activation/compute buffer, dimensionless
- ``reserve_gib``                device memory kept free for driver/display/OS, GiB (discrete GPUs)
- ``host_bw_efficiency``         achieved / peak host bandwidth for layers offloaded to the host, 0-1
- ``pcie_gbs``                   host-to-device bandwidth used when offloaded weights are streamed for prefill, GB/s
- ``tp_allreduce_us``            latency of one tensor-parallel all-reduce, microseconds
- ``vllm_graph_gib`` / ``vllm_non_torch_gib``  vLLM CUDA-graph pool and non-torch allocations, GiB
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.engines import ENGINES
from predictor.errors import BenchcalError

COEFFICIENT_NAMES = (
    "decode_fixed_ms",
    "decode_fixed_per_layer_us",
    "decode_bw_efficiency",
    "decode_kv_efficiency",
    "decode_kv_reread",
    "decode_dequant_flops_per_byte",
    "decode_generic_flops_per_byte",
    "prefill_fixed_ms",
    "prefill_dequant_bytes_per_weight",
    "prefill_unpack_flops_per_weight",
    "prefill_generic_flops_per_weight",
    "prefill_q8_flops_per_weight",
    "prefill_compute_efficiency",
    "prefill_f16_efficiency",
    "prefill_attn_efficiency",
    "prefill_scores_efficiency",
    "runtime_fixed_gib",
    "compute_buffer_scale",
    "reserve_gib",
    "host_bw_efficiency",
    "pcie_gbs",
    "tp_allreduce_us",
    "vllm_graph_gib",
    "vllm_non_torch_gib",
)

_CALC = "uncalibrated: a constant share of peak bandwidth, as public VRAM calculators assume (0.65-0.87)"
_KV = "uncalibrated: the same share of peak bandwidth as the weights (calculators do not separate the two)"
_REREAD = ("uncalibrated: every re-read of a K/V row by another query head of its group reaches DRAM, at the"
           " KV read's default share of peak bandwidth (1 / 0.75)")
_DEQUANT = "uncalibrated: decode is taken as purely bandwidth bound, as the public calculators assume"
_GENERIC = "uncalibrated: every CPU matmul format taken at one compute efficiency"
_UNPACK = "not fitted engine-wide: prefill on a unified-memory GPU is taken as purely matmul bound unless its device or family was measured"
_SCORES = ("uncalibrated: the f32 scores are written, read by the softmax, written and read again: four "
           "passes at peak bandwidth")
_F16 = ("uncalibrated: the host matmul probe is llama.cpp's own F16 prefill (harness.hostbench), so F16 weights run "
        "at its rate")
_DESIGN = "uncalibrated: a CUDA context and allocator pools take about 100-600 MiB depending on the GPU"

# Uncalibrated defaults. Each value says where it comes from; calibration replaces them.
ENGINE_DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    "llama.cpp": {
        "decode_fixed_ms": (0.0, "uncalibrated: no fixed term, as the public calculators assume"),
        "decode_fixed_per_layer_us": (0.0, "uncalibrated: no per-layer term, as the public calculators assume"),
        "decode_bw_efficiency": (0.75, _CALC + "; midpoint"),
        "decode_kv_efficiency": (0.75, _KV),
        "decode_kv_reread": (1 / 0.75, _REREAD),
        "decode_dequant_flops_per_byte": (0.0, _DEQUANT),
        "decode_generic_flops_per_byte": (0.0, _DEQUANT),
        "prefill_fixed_ms": (0.0, "uncalibrated: no fixed term"),
        "prefill_dequant_bytes_per_weight": (0.0, "uncalibrated: no dequantization traffic"),
        "prefill_unpack_flops_per_weight": (0.0, _UNPACK),
        "prefill_generic_flops_per_weight": (0.0, _GENERIC),
        "prefill_q8_flops_per_weight": (0.0, _GENERIC),
        "prefill_compute_efficiency": (0.40, "uncalibrated: a typical share of dense tensor peak for quantized matmuls"),
        "prefill_f16_efficiency": (1.0, _F16),
        "prefill_attn_efficiency": (0.40, "uncalibrated: same as the matmul efficiency"),
        "prefill_scores_efficiency": (0.25, _SCORES),
        "runtime_fixed_gib": (0.35, _DESIGN + "; midpoint"),
        "compute_buffer_scale": (1.0, "analytical buffer sizes of llama.cpp's graph (logits, FFN, attention scores)"),
        "reserve_gib": (0.5, "uncalibrated: driver/display reserve on a discrete GPU"),
        "host_bw_efficiency": (0.6, "uncalibrated: share of peak DDR bandwidth reached by CPU matmul-vec"),
        "pcie_gbs": (25.0, "PCIe 4.0 x16 practical host-to-device rate (32 GB/s theoretical)"),
        "tp_allreduce_us": (20.0, "uncalibrated: PCIe all-reduce latency"),
        "vllm_graph_gib": (0.0, "not used by llama.cpp"),
        "vllm_non_torch_gib": (0.0, "not used by llama.cpp"),
    },
    "vllm": {
        "decode_fixed_ms": (0.0, "uncalibrated: no fixed term, as the public calculators assume"),
        "decode_fixed_per_layer_us": (0.0, "uncalibrated: no per-layer term"),
        "decode_bw_efficiency": (0.75, _CALC + "; midpoint"),
        "decode_kv_efficiency": (0.75, _KV),
        "decode_kv_reread": (1 / 0.75, _REREAD),
        "decode_dequant_flops_per_byte": (0.0, _DEQUANT),
        "decode_generic_flops_per_byte": (0.0, "not used by vLLM"),
        "prefill_fixed_ms": (0.0, "uncalibrated: no fixed term"),
        "prefill_dequant_bytes_per_weight": (0.0, "uncalibrated: no dequantization traffic"),
        "prefill_unpack_flops_per_weight": (0.0, _UNPACK),
        "prefill_generic_flops_per_weight": (0.0, _GENERIC),
        "prefill_q8_flops_per_weight": (0.0, _GENERIC),
        "prefill_compute_efficiency": (0.50, "uncalibrated: a typical share of dense tensor peak for FP16 GEMMs"),
        "prefill_f16_efficiency": (1.0, "not used by vLLM"),
        "prefill_attn_efficiency": (0.50, "uncalibrated: same as the matmul efficiency"),
        "prefill_scores_efficiency": (0.25, _SCORES),
        "runtime_fixed_gib": (0.50, _DESIGN + "; upper half (torch + CUDA context)"),
        "compute_buffer_scale": (1.0, "analytical activation peak of vLLM's profile run"),
        "reserve_gib": (0.5, "uncalibrated: driver/display reserve on a discrete GPU"),
        "host_bw_efficiency": (0.6, "uncalibrated: share of peak DDR bandwidth"),
        "pcie_gbs": (25.0, "PCIe 4.0 x16 practical host-to-device rate (32 GB/s theoretical)"),
        "tp_allreduce_us": (20.0, "uncalibrated: PCIe all-reduce latency"),
        "vllm_graph_gib": (0.5, "uncalibrated: vLLM logs 'Graph capturing finished ... took 0.3-1 GiB'"),
        "vllm_non_torch_gib": (0.3, "uncalibrated: vLLM's non_torch_memory line, a few hundred MiB"),
    },
}

DEFAULT_SOURCE = "engine defaults (predictor/coefficients.py, uncalibrated)"


@dataclass(frozen=True)
class CoefficientSet:
    """The coefficients one prediction uses, with where they came from.

    ``status`` is ``default`` or ``calibrated``; ``scope`` is ``engine``, ``family:<name>``, ``device:<id>`` or
    ``prior:physics/<kind>`` (the engine scope with the physics prior's values); ``era`` the engine build era whose overlay was applied (None: builds pooled); ``uncertainty`` maps a coefficient name to a relative 1-sigma error (0.1 = 10%),
    and ``error_band`` maps a predicted quantity (decode, prefill, ttft, memory) to a relative error
    band from cross-validated residuals, when calibration provides them.
    """

    engine: str
    values: dict[str, float]
    status: str = "default"
    scope: str = "engine"
    source: str = DEFAULT_SOURCE
    uncertainty: dict[str, float] = field(default_factory=dict)
    error_band: dict[str, float] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # coefficient -> scope it came from ("default" if none)
    era: str | None = None
    band_source: str = ""  # where error_band comes from

    def source_of(self, name: str) -> str:
        """Where one coefficient's value comes from: a calibrated scope of the table, or its default's source."""
        scope = self.origin.get(name, "default")
        if scope == "default":
            return "default: " + ENGINE_DEFAULTS[self.engine][name][1]
        if scope.startswith("prior:"):
            return (f"physics prior ({scope[6:]}): from the device's memory type and FLOPS/bandwidth ratio, "
                    f"fitted on the measured devices: {self.source}")
        return f"calibrated ({scope}): {self.source}"

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def _entry_eras(engine: str, entry: dict[str, Any]) -> set[str | None]:
    """The eras of the runs a coefficient was fitted on: its ``eras`` list, else read from its engine versions."""
    if isinstance(entry.get("eras"), list):
        return set(entry["eras"])
    from predictor.eras import run_era

    return {run_era(engine, version) for version in entry.get("engine_versions") or []}


def _default_values(engine: str) -> dict[str, float]:
    return {name: value for name, (value, _src) in ENGINE_DEFAULTS[engine].items()}


def _plain(entry: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Split a scope's entry into (values, relative uncertainties, error bands)."""
    values: dict[str, float] = {}
    unc: dict[str, float] = {}
    bands: dict[str, float] = {}
    for name, item in entry.items():
        if name == "error_band" and isinstance(item, dict):
            bands.update({k: float(v) for k, v in item.items()})
            continue
        if name not in COEFFICIENT_NAMES:
            continue
        if isinstance(item, dict):
            values[name] = float(item["value"])
            if item.get("uncertainty") is not None and item["value"]:
                unc[name] = abs(float(item["uncertainty"]) / float(item["value"]))
        else:
            values[name] = float(item)
    return values, unc, bands


@dataclass(frozen=True)
class Coefficients:
    """A loaded coefficients table (or the engine defaults when ``table`` is empty)."""

    table: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def source(self) -> str:
        if not self.table:
            return DEFAULT_SOURCE
        return str(self.table.get("source") or self.path or "coefficients file")

    def lookup(self, engine: str, device_id: str, family: str, era: str | None = None,
               kind: str | None = None, device: Any = None) -> CoefficientSet:
        """Coefficients for ``engine`` on a device: device -> family -> engine scope -> defaults.

        With ``era`` (an engine build era, :mod:`predictor.eras`) and the device's ``kind``, the table's overlay
        for that era and kind (``engines.<engine>.eras.<era>.kinds.<kind>``) replaces each era term
        (``era_terms``: the fixed times, prefill's matmul efficiency) that the chosen scope fitted on runs of
        other eras too; a scope fitted on that era's runs alone keeps its own value.

        With the catalogue ``device`` (its memory type, bandwidth and matmul rate), a device that has neither a
        device nor a family scope takes the table's physics prior for its kind (:mod:`predictor.prior`) for
        the coefficients the prior describes, instead of the engine scope's average."""
        if engine not in ENGINE_DEFAULTS:
            raise BenchcalError(f"unknown engine '{engine}' (choose from: {', '.join(ENGINES)})")
        values = _default_values(engine)
        eng = (self.table.get("engines") or {}).get(engine) or {}
        # Least to most specific: each scope overrides the coefficients it fitted.
        scopes = [
            ("engine", eng.get("default")),
            ("family:" + family, (eng.get("families") or {}).get(family)),
            ("device:" + device_id, (eng.get("devices") or {}).get(device_id)),
        ]
        used = [(scope, _plain(entry)) for scope, entry in scopes if entry]
        if not used:  # engine defaults: the band is how far the defaults' model has been off on this kind
            band = dict((self.table.get("default_error_band") or {}).get(kind or "") or {})
            note = str(band.pop("source", ""))
            return CoefficientSet(engine, values, error_band={k: float(v) for k, v in band.items()
                                                              if k in ("decode", "prefill", "ttft", "memory")},
                                  band_source=note)
        unc: dict[str, float] = {}
        bands: dict[str, float] = {}
        origin: dict[str, str] = {}
        for scope, (fitted, scope_unc, scope_bands) in used:
            values.update(fitted)
            unc.update(scope_unc)
            bands.update(scope_bands)
            origin.update({name: scope for name in fitted})
        # a device scope merged from the user's own table names that table as its source
        entries = dict(scopes)
        source = str((entries.get(used[-1][0]) or {}).get("source") or self.source)
        physics = (eng.get("physics") or {}).get("kinds", {}).get(kind or "") if device is not None else None
        band_source = next((str(e.get("error_band_source")) for _, e in reversed(scopes)
                            if e and e.get("error_band_source")), "")
        if physics and used[-1][0] == "engine":
            from predictor.prior import prior_values

            prior = prior_values(physics, getattr(device, "memory_type", None), device.matmul_tflops(engine),
                                 getattr(device, "bandwidth_gbs", None))
            values.update(prior)
            origin.update({name: f"prior:physics/{kind}" for name in prior})
            for name in prior:
                unc.pop(name, None)
            bands = dict(physics.get("error_band") or bands)
            band_source = str(physics.get("error_band_source") or "")
            scope_name = f"prior:physics/{kind}" if prior else used[-1][0]
        else:
            scope_name = used[-1][0]
        overlay = self.era_overlay(engine, era, kind) if era and kind else {}
        applied = None
        from predictor.eras import era_terms

        for name, item in overlay.items():
            if name not in era_terms(engine) or not isinstance(item, dict) or not item.get("identified", True):
                continue
            own = (entries.get(origin.get(name, "")) or {}).get(name)
            if isinstance(own, dict) and _entry_eras(engine, own) == {era}:
                continue  # fitted on this era's runs alone
            values[name] = float(item["value"])
            origin[name] = f"era:{era}/{kind}"
            applied = era
            if item.get("uncertainty") is not None and item["value"]:
                unc[name] = abs(float(item["uncertainty"]) / float(item["value"]))
        return CoefficientSet(engine, values, "calibrated", scope_name, source, unc, bands, origin, applied,
                              band_source)

    def era_overlay(self, engine: str, era: str | None, kind: str | None) -> dict[str, Any]:
        """The era terms fitted for ``era`` on devices of ``kind`` (empty when the table has none)."""
        eras = ((self.table.get("engines") or {}).get(engine) or {}).get("eras") or {}
        return dict(((eras.get(era or "") or {}).get("kinds") or {}).get(kind or "") or {})

    def newest_era(self, engine: str, kind: str) -> str | None:
        """The newest era (catalogue order) with an overlay for ``kind``: what ``predict`` uses by default."""
        from predictor.eras import eras

        fitted = [e.id for e in eras(engine) if self.era_overlay(engine, e.id, kind)]
        return fitted[-1] if fitted else None

    def host_figures(self, engine: str, device_id: str) -> dict[str, Any] | None:
        """The probe figures a CPU host's coefficients were fitted against (``bandwidth_gbs``, ``matmul_gflops``),
        or None when the table has no scope for that host."""
        entry = (((self.table.get("engines") or {}).get(engine) or {}).get("devices") or {}).get(device_id) or {}
        figures = entry.get("host_figures")
        return dict(figures) if isinstance(figures, dict) and figures.get("bandwidth_gbs") else None

    def has_device(self, engine: str, device_id: str) -> bool:
        """True when the table has a device scope for ``device_id`` (the device was measured)."""
        return bool((((self.table.get("engines") or {}).get(engine) or {}).get("devices") or {}).get(device_id))

    def with_devices_from(self, other: Coefficients) -> Coefficients:
        """This table with the device scopes of ``other`` (a user's fit) replacing its own; the families and
        engine scopes stay this table's. Each merged scope carries ``other``'s source."""
        if not other.table:
            return self
        table = json.loads(json.dumps(self.table)) if self.table else {"schema_version": 1, "engines": {}}
        for engine, eng in (other.table.get("engines") or {}).items():
            mine = table.setdefault("engines", {}).setdefault(engine, {"default": {}, "families": {}, "devices": {}})
            for device_id, entry in (eng.get("devices") or {}).items():
                mine.setdefault("devices", {})[device_id] = {**entry, "source": entry.get("source") or other.source}
        merged_from = [p for p in (self.path, other.path) if p]
        return Coefficients(table, " + ".join(merged_from) or None)


def load_coefficients(path: str | Path | None) -> Coefficients:
    """Read a coefficients JSON file; ``None`` means engine defaults. Bad files raise BenchcalError."""
    if path is None:
        return Coefficients()
    p = Path(path)
    if not p.is_file():
        raise BenchcalError(f"coefficients file not found: {p}")
    try:
        table = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchcalError(f"coefficients file {p} is not valid JSON: {exc}") from None
    if not isinstance(table, dict) or not isinstance(table.get("engines"), dict):
        raise BenchcalError(f"coefficients file {p} has no 'engines' table")
    return Coefficients(table, str(p))


def default_coefficients_path() -> Path | None:
    """The shipped calibration table (calibration/coefficients.json), if present beside the packages."""
    candidate = Path(__file__).resolve().parent.parent / "calibration" / "coefficients.json"
    return candidate if candidate.is_file() else None


def default_coefficients() -> Coefficients:
    """What ``predict`` uses by default: the shipped table, with the device scopes of the user's own fit
    (``$BENCHCAL_HOME/calibration/coefficients.json``, :mod:`predictor.userdata`) replacing its own."""
    from predictor.userdata import user_coefficients_path

    shipped = load_coefficients(default_coefficients_path())
    user_path = user_coefficients_path()
    return shipped.with_devices_from(load_coefficients(user_path)) if user_path else shipped


HOST_UNCALIBRATED = "uncalibrated on this host; `make bench` calibrates it in ~3 minutes"


def host_calibration_note(kind: str, device_id: str, scope: str) -> str | None:
    """For a CPU no run describes: says its coefficients are a prior from other hosts, and how to fit its own."""
    if kind != "cpu" or scope == f"device:{device_id}":
        return None
    prior = "engine defaults" if scope == "engine" else f"prior from {scope}"
    return f"{device_id}: {HOST_UNCALIBRATED} ({prior})"
