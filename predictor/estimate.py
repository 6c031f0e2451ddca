"""The analytical model end to end: one configuration in, one :class:`Estimate` out.

``evaluate`` is the vectorized core (one model; devices, quants, contexts, batches as arrays);
``predict`` resolves names, calls it for one configuration and packs the result. Reports and the
harness use ``predict``; leaderboards, recommendations and the speed benchmark use ``evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from predictor import memory as mem
from predictor import throughput as tp
from predictor.architecture import ModelArch
from predictor.coefficients import (
    Coefficients,
    CoefficientSet,
    default_coefficients,
    host_calibration_note,
    load_coefficients,
)
from predictor.devices import Device, resolve_device
from predictor.engines import traits
from predictor.eras import era_description, era_for_build
from predictor.errors import BenchcalError, non_negative, positive
from predictor.launch import launch_commands
from predictor.models import resolve_model
from predictor.quants import QuantFormat, normalize_engine, resolve_kv_dtype, resolve_quant
from predictor.serving import DEFAULT_GPU_MEMORY_UTILIZATION, kv_pool
from predictor.weights import (
    WEIGHTS_FROM_FILE,
    cpu_kernel_kwargs,
    format_bits,
    known_weights_bytes,
    require_bits,
    weights_bits_per_weight,
)

GIB = mem.GIB
TIGHT_UTILIZATION = 0.92  # above this share of usable memory, allocator rounding and fragmentation bite
VERDICTS = ("fits", "tight", "needs offload", "does not fit")
DEFAULT_PROMPT_TOKENS = 4096  # like the public calculators' TTFT figure
DEFAULT_HOST_BANDWIDTH_GBS = 60.0  # dual-channel DDR5-4800 (2 x 38.4 GB/s peak), a typical desktop host
DEFAULT_HOST_MEMORY_GIB = 64.0


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def evaluate(
    arch: ModelArch,
    engine: str,
    coeffs,
    *,
    memory_gib,
    usable_gib,
    kind,
    bandwidth_gbs,
    tflops,
    bits_per_weight,
    bits_per_weight_non_expert=None,
    exact_weights_bytes=None,
    kv_bytes_per_element=2.0,
    context=4096,
    batch=1,
    prompt_tokens=DEFAULT_PROMPT_TOKENS,
    device_count=1,
    offload_fraction=0.0,
    flash_attn=True,
    n_ubatch=512,
    host_bandwidth_gbs=DEFAULT_HOST_BANDWIDTH_GBS,
    host_memory_gib=DEFAULT_HOST_MEMORY_GIB,
    enforce_eager=False,
    cpu_repack=0.0,
    cpu_repack_weights=None,
    cpu_float_weights=0.0,
    cpu_q8_weights=0.0,
    cpu_generic_bytes=0.0,
    cublas_dequant=False,
    with_max_context: bool = True,
) -> dict[str, np.ndarray]:
    """Evaluate the model over broadcastable arrays; returns arrays keyed by quantity (bytes, s).

    ``kind`` is the device kind ("gpu", "unified", "cpu"); ``offload_fraction`` is the share of the
    repeating layers kept in host memory (llama.cpp layers; vLLM cpu_offload_gb). ``enforce_eager``
    (vLLM) drops the CUDA-graph pool; there are no CUDA graphs on a CPU device either.
    On a CPU device, llama.cpp multiplies its layer matrices on three paths (``predictor.weights.cpu_kernel_mix``,
    per quant): ``cpu_repack`` is the share of their bytes it repacks (an extra copy in memory), and
    ``cpu_repack_weights`` (default: the same share) of their weights; ``cpu_float_weights`` the share in
    F16/BF16/F32 (llamafile's GEMM, at ``prefill_f16_efficiency``), ``cpu_q8_weights`` in Q8_0 (its generic dot
    product, ``prefill_q8_flops_per_weight``); the rest take the generic quantized path
    (``prefill_generic_flops_per_weight``), and their share of the bytes, ``cpu_generic_bytes``, unpacks at
    ``decode_generic_flops_per_byte`` more per byte in decode.
    ``cublas_dequant``: the run's llama.cpp CUDA build dequantized quantized weights to FP16 for cuBLAS in
    prefill (its log says ``CUDA_USE_TENSOR_CORES: yes``; builds before PR #8075, June 2024). Calibration sets
    it from imported logs; predictions describe current builds and leave it False.
    """
    kind = np.asarray(kind)
    et = traits(engine)
    on_gpu = kind == "gpu"
    n_dev = _arr(device_count)
    L = arch.num_layers
    total_w = mem.weights_bytes(arch, bits_per_weight, bits_per_weight_non_expert)
    if exact_weights_bytes is not None:  # NaN where a quant's bytes are unknown: its average width
        exact = _arr(exact_weights_bytes) + np.zeros_like(total_w)
        total_w = np.where(np.isfinite(exact), exact, total_w)
    embd_w = mem.embedding_bytes(arch, total_w, bits_per_weight, bits_per_weight_non_expert)
    out_w = mem.output_bytes(arch, total_w, bits_per_weight, bits_per_weight_non_expert)
    # llama.cpp keeps the input embedding on the host (untied models); vLLM keeps everything on the GPU.
    host_embd = embd_w if (et.host_embedding and arch.params_output) else 0.0
    layer_w = total_w - embd_w - (out_w if arch.params_output else 0.0)
    # Offload only exists for discrete GPUs; clamp to whole layers for llama.cpp.
    frac = np.where(on_gpu, np.clip(_arr(offload_fraction), 0.0, 1.0), 0.0)
    if et.layer_offload:
        frac = np.round(frac * L) / L
    out_on_device = frac == 0.0
    # the input embedding of an untied model: on the device, except llama.cpp's on a discrete GPU (host memory)
    own_embd = embd_w if arch.params_output else 0.0
    dev_w = (1.0 - frac) * layer_w + np.where(out_on_device, out_w, 0.0) + own_embd - np.where(on_gpu, host_embd, 0.0)
    host_w = total_w - dev_w
    repack_share = np.asarray(cpu_repack, float)
    repack = mem.cpu_repack_bytes(layer_w, np.where(kind == "cpu", repack_share, 0.0)) if et.cpu_kernel_paths else 0.0
    resident_w = dev_w + repack
    kv_total = mem.kv_cache_bytes(arch, context, batch, kv_bytes_per_element, engine)
    kv_host_share = frac if et.layer_offload else 0.0  # llama.cpp keeps KV with its layer
    dev_kv = kv_total * (1.0 - kv_host_share)
    eager = np.logical_or(np.asarray(enforce_eager, bool), kind == "cpu")
    runtime = mem.runtime_bytes(arch, engine, coeffs, context, n_ubatch, flash_attn, batch, eager) * n_dev
    total = resident_w + dev_kv + runtime
    usable = mem.usable_device_bytes(memory_gib, usable_gib, kind, coeffs["reserve_gib"]) * n_dev
    util = total / usable
    # Layers (and, for llama.cpp, their KV) kept in host RAM; the input embedding is not counted.
    offload_bytes = frac * (layer_w + (kv_total if et.layer_offload else 0.0)) + np.where(out_on_device, 0.0, out_w)
    # Verdict: fits / tight / needs offload (a discrete GPU that can hold the runtime and the host
    # can hold the rest) / does not fit.
    host_usable = _arr(host_memory_gib) * GIB * 0.9
    can_offload = on_gpu & (runtime < usable) & (total - usable + host_w < host_usable)
    verdict = np.where(util <= TIGHT_UTILIZATION, 0, np.where(util <= 1.0, 1, np.where(can_offload, 2, 3)))

    # Throughput.
    tensor_parallel = et.tensor_parallel
    ctx_now = np.minimum(_arr(prompt_tokens), _arr(context))
    # Weights streamed per step: the active layers and the LM head; the part on the host is read there.
    step_w = tp.decode_weight_bytes_per_step(arch, total_w, batch, bits_per_weight, bits_per_weight_non_expert)
    step_dev = (1.0 - frac) * (step_w - out_w) + np.where(out_on_device, out_w, 0.0)
    kv_read = mem.kv_cache_bytes(arch, ctx_now, batch, kv_bytes_per_element, "llama.cpp")
    kv_reread = kv_read * (mem.attention_kv_read_factor(arch, engine, flash_attn) - 1.0)
    bw = _arr(bandwidth_gbs)
    quantized = _arr(bits_per_weight) < 16.0
    # Quantized bytes the device's ALUs unpack per step (the step's device-resident weights), where the listed
    # or measured FLOPS are those ALUs' rate: unified-memory GPUs (Apple: no matrix units) and the CPU (its
    # measured FP32 rate). On this machine's CPU, Q4_0 and Q8_0 decode both reach 0.38-0.57 of the measured
    # bandwidth and F16 0.75-0.82: the cost follows the bytes unpacked. A discrete GPU's listed peak is its
    # tensor cores', not the ALUs that unpack.
    dequant_b = np.where(quantized & ((kind == "unified") | (kind == "cpu")), step_dev, 0.0)
    # Quantized weights (the step's share on the device) Metal's matmul kernels unpack per prompt token.
    unpack_w = np.where(quantized & (kind == "unified"),
                        tp.decode_params_per_step(arch, batch) * step_dev / np.maximum(step_w, 1.0), 0.0)
    step_s = tp.decode_step_seconds(
        arch,
        coeffs,
        device_weight_bytes=step_dev,
        host_weight_bytes=step_w - step_dev + (kv_read + kv_reread) * kv_host_share,  # offloaded layers' weights, KV
        kv_read_bytes=kv_read * (1.0 - kv_host_share),
        kv_reread_bytes=kv_reread * (1.0 - kv_host_share),
        bandwidth_gbs=bw,
        # vLLM's cpu_offload_gb streams the offloaded weights over PCIe every step.
        host_bandwidth_gbs=np.where(kind == "gpu", _arr(host_bandwidth_gbs) if not et.pcie_streamed_offload
                                    else np.minimum(_arr(host_bandwidth_gbs), coeffs["pcie_gbs"]), bw),
        device_count=n_dev,
        tensor_parallel=tensor_parallel,
        dequant_bytes=dequant_b,
        generic_dequant_bytes=np.where((kind == "cpu") & et.cpu_kernel_paths,
                                       (1.0 - frac) * (step_w - out_w) * np.asarray(cpu_generic_bytes, float), 0.0),
        tflops=tflops,
    )
    cpu_llama = (kind == "cpu") & et.cpu_kernel_paths
    layer_params = arch.params_active - tp.lm_head_params(arch)
    prefill_s = tp.prefill_seconds(
        arch,
        coeffs,
        prompt_tokens=prompt_tokens,
        n_ubatch=n_ubatch,
        device_weight_bytes=dev_w,
        host_weight_bytes=np.where(on_gpu, host_w - host_embd, 0.0),
        bandwidth_gbs=bw,
        tflops=tflops,
        scores_in_memory=mem.attention_through_memory(engine, flash_attn),
        device_count=n_dev,
        tensor_parallel=tensor_parallel,
        dequant_weights=np.where(quantized & on_gpu & np.asarray(cublas_dequant, bool),
                                 (1.0 - frac) * (arch.params_total - arch.params_non_layer), 0.0),
        unpack_weights=unpack_w,
        # On the CPU, llama.cpp repacks Q4_0 / Q4_K / IQ4_NL tensors into interleaved GEMM layouts, multiplies
        # F16/BF16 ones with llamafile's GEMM and the other formats (Q8_0, Q5_0, Q6_K, ...) on its generic path:
        # three rates, whose order differs between CPUs (AVX2 Zen 3: F16 fastest; AVX-512 Zen 4: Q4_0).
        generic_weights=np.where(cpu_llama, layer_params * np.maximum(0.0, (
            1.0 - np.asarray(repack_share if cpu_repack_weights is None else cpu_repack_weights, float)
            - np.asarray(cpu_float_weights, float) - np.asarray(cpu_q8_weights, float))), 0.0),
        q8_weights=np.where(cpu_llama, layer_params * np.asarray(cpu_q8_weights, float), 0.0),
        float_share=np.where(cpu_llama, np.asarray(cpu_float_weights, float), 0.0),
    )
    result = {
        "weights_bytes": resident_w + np.zeros_like(dev_w),
        "weights_total_bytes": np.broadcast_to(total_w, np.shape(dev_w)),
        "kv_cache_bytes": dev_kv,
        "runtime_bytes": runtime,
        "total_bytes": total,
        "offload_bytes": offload_bytes,
        "usable_bytes": usable,
        "headroom_bytes": usable - total,
        "utilization": util,
        "verdict": verdict,
        "decode_step_s": step_s,
        "decode_tok_s": 1.0 / step_s,
        "decode_tok_s_total": _arr(batch) / step_s,
        "prefill_s": prefill_s,
        "prefill_tok_s": _arr(prompt_tokens) / prefill_s,
        "ttft_s": prefill_s,
        "decode_context": ctx_now,
    }
    # Most layers that fit (llama.cpp -ngl): per-layer device bytes are the layer's weights and KV.
    per_layer = (layer_w + kv_total) / L
    fixed = runtime + np.where(on_gpu, 0.0, host_embd)
    room = usable * TIGHT_UTILIZATION - fixed
    ngl = np.clip(np.floor(room / per_layer), 0, L)
    ngl = np.where(room >= per_layer * L + out_w, L + 1, ngl)
    result["max_gpu_layers"] = np.where(on_gpu, ngl, L + 1)
    if with_max_context:
        result["max_context"] = _max_context(arch, engine, coeffs, usable, resident_w, frac, n_dev,
                                             kv_bytes_per_element, batch, n_ubatch, flash_attn, eager)
    return result


def _max_context(arch, engine, coeffs, usable, dev_w, frac, n_dev, kv_bpe, batch, n_ubatch, flash_attn, eager):
    """Largest context (multiple of 256, up to the model's maximum) whose total stays "fits"."""
    kv_share = frac if traits(engine).layer_offload else 0.0

    def total_at(ctx):
        kv = mem.kv_cache_bytes(arch, ctx, batch, kv_bpe, engine) * (1.0 - kv_share)
        rt = mem.runtime_bytes(arch, engine, coeffs, ctx, n_ubatch, flash_attn, batch, eager) * n_dev
        return dev_w + kv + rt

    limit = usable * TIGHT_UTILIZATION
    shape = np.broadcast(usable, dev_w).shape
    lo = np.zeros(shape)
    hi = np.full(shape, float(arch.max_context))
    ok_hi = total_at(hi) <= limit
    for _ in range(24):
        mid = np.floor((lo + hi) / 2.0)
        fits = total_at(mid) <= limit
        lo = np.where(fits, mid, lo)
        hi = np.where(fits, hi, mid)
    best = np.where(ok_hi, float(arch.max_context), np.floor(lo / 256.0) * 256.0)
    return np.where(total_at(np.maximum(best, 1.0)) <= limit, best, 0.0)


# --------------------------------------------------------------------------- one configuration


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

    @property
    def weights_bits_per_weight(self) -> float | None:
        return weights_bits_per_weight(self.model, self.quant, self.values["weights_total_bytes"], self.weights_source)

    @property
    def verdict(self) -> str:
        return VERDICTS[int(self.values["verdict"])]

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON contract of ``benchcal predict --format json`` (documented in docs/commands.md)."""
        v = self.values
        d, m = self.device, self.model
        price = d.cloud_usd_per_hour
        cost = None
        if price and v["decode_tok_s_total"] > 0:
            cost = round(price * self.device_count / (v["decode_tok_s_total"] * 3600.0) * 1e6, 2)
        c = self.coefficients
        return {
            "schema": "benchcal.estimate/1",
            "model": {
                "id": m.id, "name": m.name, "hf_id": m.hf_id, "source": m.source,
                "params_b": round(m.params_total / 1e9, 3),
                "active_params_b": round(m.params_active / 1e9, 3),
                "architecture": m.architecture, "attention": m.attention, "layers": m.num_layers,
                "max_context": m.max_context, "moe": bool(m.num_experts),
            },
            "gpu": {
                "id": d.id, "name": d.name, "kind": d.kind, "count": self.device_count,
                "memory_gib": round(d.memory_gib, 2),
                "usable_gib": round(v["usable_bytes"] / GIB, 2),
                "bandwidth_gbs": d.bandwidth_gbs, "fp16_tflops": d.fp16_tflops,
                "matmul_tflops": d.matmul_tflops(self.engine), "family": d.family,
                "cloud_usd_per_hour": price,
            },
            "engine": self.engine,
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
                "max_context": int(v["max_context"]),
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
                "host_bandwidth_gbs": self.host_bandwidth_gbs,
                "offload_fraction": round(self.throughput_offload_fraction, 4),
                "cost_per_1m_output_usd": cost,
            },
            "calibration": {
                "status": c.status, "scope": c.scope, "source": c.source,
                "error_band": dict(c.error_band), "error_band_source": c.band_source, "note": host_calibration_note(self.device.kind, self.device.id, c.scope),
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


def require_context(arch: ModelArch, context: int) -> None:
    """A positive context no longer than the model's maximum, else a BenchcalError."""
    positive("--ctx", context)
    if context > arch.max_context:
        raise BenchcalError(f"context {context} is above {arch.id}'s maximum of {arch.max_context} tokens")


def device_kwargs(device: Device, engine: str) -> dict[str, Any]:
    """The device's figures as keyword arguments of ``evaluate`` for ``engine`` (whose matmul peak may differ)."""
    tflops = device.matmul_tflops(engine)
    return {
        "memory_gib": device.memory_gib,
        "usable_gib": np.nan if device.usable_gib is None else device.usable_gib,
        "kind": device.kind,
        "bandwidth_gbs": np.nan if device.bandwidth_gbs is None else device.bandwidth_gbs,
        "tflops": np.nan if tflops is None else tflops,
    }


def predict(
    model: str | ModelArch,
    device: str | Device,
    quant: str | None = None,
    context: int = 8192,
    engine: str = "llama.cpp",
    *,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    batch: int = 1,
    kv_dtype: str | None = None,
    device_count: int = 1,
    offload_fraction: float = 0.0,
    flash_attn: bool = True,
    n_ubatch: int = 512,
    coefficients: str | Path | Coefficients | None = "default",
    host_bandwidth_gbs: float | None = None,
    host_memory_gib: float | None = None,
    enforce_eager: bool = False,
    launch: bool = True,
    engine_build: str | int | None = None,
    gpu_memory_utilization: float | None = None,
) -> Estimate:
    """Predict memory, fit and throughput for one configuration.

    ``device`` is a catalogue id/name or a :class:`Device` (use ``predictor.devices.cpu_device`` for
    the host CPU). ``quant`` defaults to the GGUF's own type or Q4_K_M (llama.cpp) / BF16 (vLLM).
    ``coefficients``: a path, a loaded table, ``None`` for engine defaults, or ``"default"`` for the
    committed calibration table when present. ``engine_build``: the engine build (llama.cpp build number) or
    version (vLLM) to predict for; its era's fitted values are used (default: the newest era with data).
    ``gpu_memory_utilization``: vLLM's share of the device its KV pool is sized from (default 0.9, as ``vllm serve``).
    """
    eng = normalize_engine(engine)
    arch = model if isinstance(model, ModelArch) else resolve_model(model)
    dev = device if isinstance(device, Device) else resolve_device(device)
    if quant is None:
        quant = arch.weights_quant or traits(eng).default_quant
    q = resolve_quant(quant, eng)
    kv_name = kv_dtype or traits(eng).default_kv_dtype
    kv = resolve_kv_dtype(kv_name, eng)
    positive("--ctx", context)
    positive("--prompt", prompt_tokens)
    positive("--batch", batch)
    positive("--gpus", device_count)
    positive("--n-ubatch", n_ubatch)
    non_negative("--offload", offload_fraction)
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise BenchcalError(f"--gpu-memory-utilization is a fraction of the device in (0, 1], got {gpu_memory_utilization}")
    if offload_fraction > 1:
        raise BenchcalError(f"--offload is a fraction of the layers, between 0 and 1, got {offload_fraction}")
    require_context(arch, context)
    if eng not in dev.engines:
        raise BenchcalError(f"{eng} does not run on {dev.name} (engines there: {', '.join(dev.engines)})")
    if device_count > 1 and dev.kind != "gpu":
        raise BenchcalError(f"--gpus {device_count}: tensor parallelism needs discrete GPUs, {dev.name} is {dev.kind}")
    if isinstance(coefficients, Coefficients):
        table = coefficients
    elif coefficients == "default":
        table = default_coefficients()
    else:
        table = load_coefficients(coefficients)
    era = era_for_build(eng, engine_build).id if engine_build is not None else table.newest_era(eng, dev.kind)
    cset = table.lookup(eng, dev.id, dev.family, era, dev.kind, dev)
    exact, weights_source = known_weights_bytes(arch, q, eng)
    require_bits(q, exact)
    expert_bits, other_bits = format_bits(arch, q, eng)
    host_bw = float(host_bandwidth_gbs or (dev.bandwidth_gbs if dev.kind == "cpu" else DEFAULT_HOST_BANDWIDTH_GBS))
    values = evaluate(
        arch, eng, cset,
        **device_kwargs(dev, eng),
        bits_per_weight=expert_bits,
        bits_per_weight_non_expert=other_bits,
        exact_weights_bytes=exact,
        kv_bytes_per_element=kv.bytes_per_element,
        context=context, batch=batch, prompt_tokens=prompt_tokens, device_count=device_count,
        offload_fraction=offload_fraction, flash_attn=flash_attn, n_ubatch=n_ubatch,
        host_bandwidth_gbs=host_bw,
        host_memory_gib=host_memory_gib or DEFAULT_HOST_MEMORY_GIB,
        enforce_eager=enforce_eager,
        **cpu_kernel_kwargs(arch, q.id),
    )
    scalars = {k: float(np.asarray(val).reshape(-1)[0]) for k, val in values.items()}
    throughput_offload = float(offload_fraction)
    if VERDICTS[int(scalars["verdict"])] == "needs offload" and offload_fraction == 0:
        # Memory and verdict describe the configuration asked for; the speeds describe the one that
        # runs: the most layers that fit on the device, the rest in host RAM.
        layers = arch.num_layers
        throughput_offload = 1.0 - min(scalars["max_gpu_layers"], layers) / layers
        rerun = evaluate(arch, eng, cset, **device_kwargs(dev, eng), bits_per_weight=expert_bits,
                         bits_per_weight_non_expert=other_bits, exact_weights_bytes=exact,
                         kv_bytes_per_element=kv.bytes_per_element, context=context, batch=batch,
                         prompt_tokens=prompt_tokens, device_count=device_count,
                         offload_fraction=throughput_offload, flash_attn=flash_attn, n_ubatch=n_ubatch,
                         host_bandwidth_gbs=host_bw, host_memory_gib=host_memory_gib or DEFAULT_HOST_MEMORY_GIB,
                         enforce_eager=enforce_eager, with_max_context=False, **cpu_kernel_kwargs(arch, q.id))
        for key in ("decode_step_s", "decode_tok_s", "decode_tok_s_total", "prefill_s", "prefill_tok_s", "ttft_s"):
            scalars[key] = float(np.asarray(rerun[key]).reshape(-1)[0])
        scalars["recommended_offload_bytes"] = float(np.asarray(rerun["offload_bytes"]).reshape(-1)[0])
    est = Estimate(
        model=arch, device=dev, quant=q, engine=eng, context=int(context), batch=int(batch), kv_dtype=kv.id,
        device_count=int(device_count), prompt_tokens=int(prompt_tokens), offload_fraction=float(offload_fraction),
        flash_attn=bool(flash_attn), n_ubatch=int(n_ubatch), coefficients=cset, values=scalars,
        weights_source=weights_source, host_bandwidth_gbs=host_bw, throughput_offload_fraction=throughput_offload,
        era=era_description(eng, dev.kind, era, engine_build, cset),
    )
    est.serving = kv_pool(est, gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION)
    if launch:
        est.launch = launch_commands(est, predict)
    return est
