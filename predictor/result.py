"""One prediction's result, :class:`Estimate`: its inputs resolved, the model's figures, and the stable JSON
contract of ``benchcal predict --format json`` (documented in docs/commands.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from predictor import memory as mem
from predictor.architecture import ModelArch
from predictor.coefficients import CoefficientSet, host_calibration_note
from predictor.devices import Device
from predictor.prices import cheapest_rental
from predictor.quants import QuantFormat
from predictor.weights import WEIGHTS_FROM_FILE, weights_bits_per_weight

GIB = mem.GIB
VERDICTS = ("fits", "tight", "needs offload", "does not fit")


@dataclass
class Estimate:
    """One prediction: inputs, memory breakdown, fit, throughput, launch commands, provenance."""

    model: ModelArch
    device: Device
    quant: QuantFormat
    engine: str
    context: int
    batch: int
    kv_dtype: str
    device_count: int
    prompt_tokens: int
    offload_fraction: float
    flash_attn: bool
    n_ubatch: int
    coefficients: CoefficientSet
    values: dict[str, float]
    weights_source: str  # WEIGHTS_FROM_FILE, _PLAN, _NATIVE_EXPERTS or _WIDTH
    host_bandwidth_gbs: float
    throughput_offload_fraction: float = 0.0  # the offload the speeds assume (the recommended one when needed)
    launch: dict[str, str] = field(default_factory=dict)
    era: dict[str, Any] = field(default_factory=dict)  # the engine build era used (see era_description)
    serving: dict[str, Any] | None = None  # vLLM on a GPU: its KV pool and concurrency (predictor.serving)
    prompt_depth: int = 0  # tokens already in the KV cache when the prompt arrives
    backend: str | None = None  # llama.cpp's backend (predictor.backends); None for vLLM
    backend_default: bool = True  # the device vendor's default backend (else the one asked for)
    evidence: dict[str, Any] | None = None  # predictor.evidence.evidence_level of this prediction
    expert_tile: int | None = None  # token columns of the tiles a MoE's routed experts are multiplied in (prefill)

    @property
    def weights_bits_per_weight(self) -> float | None:
        return weights_bits_per_weight(self.model, self.quant, self.values["weights_total_bytes"], self.weights_source)

    @property
    def verdict(self) -> str:
        return VERDICTS[int(self.values["verdict"])]

    def _tensor_parallel(self, v: dict[str, Any]) -> dict[str, Any] | None:
        """How the engine's tensor parallelism splits the attention over the devices (None: one device, or a layer
        split): :func:`predictor.memory.tensor_parallel_shards`, with each rank's KV cache."""
        n = int(self.device_count)
        if n <= 1 or not mem.traits(self.engine).tensor_parallel:
            return None
        shards = mem.tensor_parallel_shards(self.model, n, self.engine)
        return {**shards, "kv_cache_per_rank_gib": _r(float(v["kv_cache_bytes"]) / n / GIB)}

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON contract of ``benchcal predict --format json`` (documented in docs/commands.md)."""
        v = self.values
        d, m = self.device, self.model
        ev = self.evidence  # predictor.evidence: the level, its basis and the band at that level
        # the cheapest dated on-demand offer of the devices predicted (what benchcal cost and recommend quote too)
        rental = cheapest_rental(d, int(self.device_count)) if d.kind != "cpu" else None
        price = rental[1].usd_per_gpu_hour if rental else None
        cost = None
        if rental and v["decode_tok_s_total"] > 0:
            cost = round(rental[0] / (v["decode_tok_s_total"] * 3600.0) * 1e6, 2)
        c = self.coefficients
        return {
            "schema": "benchcal.estimate/1",
            "model": {
                "id": m.id, "name": m.name, "hf_id": m.hf_id, "source": m.source,
                "params_b": round(m.params_total / 1e9, 3),
                "active_params_b": round(m.params_active / 1e9, 3),
                "architecture": m.architecture, "attention": m.attention_kind, "layers": m.num_layers,
                "max_context": m.max_context, "moe": bool(m.num_experts),
                "native_max_context": m.native_max_context,
                "rope_scaling": None if m.rope_scaling is None else {
                    "type": m.rope_scaling.type, "factor": m.rope_scaling.factor,
                    "original_max_context": m.rope_scaling.original_max_context,
                    "max_context": m.rope_scaling.max_context, "in_config": m.rope_scaling.in_config,
                    "enabled": m.rope_scaling.in_config or m.long_context,
                    "source": m.rope_scaling.source, "note": m.rope_scaling.note or None},
            },
            "gpu": {
                "id": d.id, "name": d.name, "kind": d.kind, "count": self.device_count,
                "memory_gib": round(d.memory_gib, 2),
                "usable_gib": round(v["usable_bytes"] / GIB, 2),
                "bandwidth_gbs": d.bandwidth_gbs, "fp16_tflops": d.fp16_tflops,
                "matmul_tflops": d.matmul_tflops(self.engine), "family": d.family,
                "cloud_usd_per_hour": price,
                "cloud_offer": None if rental is None else {
                    "provider": rental[1].provider, "product": rental[1].product, "billing": rental[1].billing,
                    "min_gpus": rental[1].min_gpus, "checked_at": rental[1].checked_at, "source": rental[1].source},
            },
            "engine": self.engine,
            "backend": None if self.backend is None else {
                "id": self.backend, "chosen": "vendor default" if self.backend_default else "asked",
                "expert_tile_tokens": self.expert_tile if self.model.num_experts else None},
            "tensor_parallel": self._tensor_parallel(v),
            "quant": self.quant.id,
            "bits_per_weight": self.quant.bits_per_weight,
            "context": self.context,
            "batch": self.batch,
            "kv_dtype": self.kv_dtype,
            "flash_attn": self.flash_attn,
            "n_ubatch": self.n_ubatch,
            "offload_fraction": self.offload_fraction,
            "memory": {
                "weights_gib": _r(v["weights_bytes"] / GIB),
                "weights_total_gib": _r(v["weights_total_bytes"] / GIB),
                "weights_exact": self.weights_source == WEIGHTS_FROM_FILE,
                "weights_source": self.weights_source,
                "weights_bits_per_weight": self.weights_bits_per_weight,
                "kv_cache_gib": _r(v["kv_cache_bytes"] / GIB),
                "runtime_gib": _r(v["runtime_bytes"] / GIB),
                "total_gib": _r(v["total_bytes"] / GIB),
                "offload_gib": _r(v["offload_bytes"] / GIB),
            },
            "fit": {
                "verdict": self.verdict,
                "headroom_gib": _r(v["headroom_bytes"] / GIB),
                "utilization": round(float(v["utilization"]), 4),
                # null, not 0, where no context fits on the device (as the leaderboard's rows say it)
                "max_context": int(v["max_context"]) if v["max_context"] > 0 else None,
                "max_gpu_layers": int(v["max_gpu_layers"]),
                "recommended_offload_gib": _r(v.get("recommended_offload_bytes", 0.0) / GIB),
            },
            "throughput": {
                "decode_tok_s": _r(v["decode_tok_s"], 2),
                "decode_tok_s_total": _r(v["decode_tok_s_total"], 2),
                "decode_context": int(v["decode_context"]),
                "prefill_tok_s": _r(v["prefill_tok_s"], 1),
                "ttft_ms": _r(v["ttft_s"] * 1000.0, 1),
                "prompt_tokens": self.prompt_tokens,
                "prompt_depth": self.prompt_depth,
                "host_bandwidth_gbs": self.host_bandwidth_gbs,
                "offload_fraction": round(self.throughput_offload_fraction, 4),
                "cost_per_1m_output_usd": cost,
            },
            "calibration": {
                "status": c.status, "scope": c.scope, "source": c.source,
                "error_band": dict(ev["band"]) if ev else dict(c.error_band),
                "error_band_source": ev["band_source"] if ev else c.band_source,
                "evidence": None if ev is None else {"level": ev["level"], "basis": ev["basis"]}, "note": host_calibration_note(self.device.kind, self.device.id, c.scope),
                "coefficients": {k: c.values[k] for k in sorted(c.values)},
                "coefficient_sources": {k: c.source_of(k) for k in sorted(c.values)},
                "era": dict(self.era),
            },
            "serving": dict(self.serving) if self.serving else None,
            "launch": dict(self.launch),
        }


def _r(x, nd: int = 3) -> float | None:
    """Round for the JSON contract; a figure the catalogue cannot give (NaN) becomes null."""
    x = float(x)
    return None if x != x else round(x, nd)
