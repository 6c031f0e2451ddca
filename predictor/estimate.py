"""The analytical model end to end: one configuration in, one :class:`Estimate` out.

``evaluate`` is the vectorized core (one model; devices, quants, contexts, batches as arrays);
``predict`` resolves names, calls it for one configuration and packs the result. Reports and the
harness use ``predict``; leaderboards, recommendations and the speed benchmark use ``evaluate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from predictor import memory as mem
from predictor import throughput as tp
from predictor.architecture import ModelArch
from predictor.coefficients import Coefficients, default_coefficients, load_coefficients
from predictor.devices import Device
from predictor.engines import traits
from predictor.eras import cublas_dequant, era_description, era_for_build
from predictor.evidence import evidence_level
from predictor.launch import launch_commands
from predictor.quants import normalize_engine
from predictor.result import VERDICTS, Estimate
from predictor.scenario import (
    DEFAULT_CONTEXT,
    DEFAULT_HOST_BANDWIDTH_GBS,
    DEFAULT_HOST_MEMORY_GIB,
    DEFAULT_N_UBATCH,
    DEFAULT_PROMPT_TOKENS,
    Scenario,
    scenario_arch,
    scenario_device,
    scenario_inputs,
    validate_scenario,
)
from predictor.serving import kv_pool
from predictor.weights import require_bits

GIB = mem.GIB
TIGHT_UTILIZATION = 0.92  # above this share of usable memory, allocator rounding and fragmentation bite


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
    prompt_depth=0.0,
    device_count=1,
    offload_fraction=0.0,
    flash_attn=True,
    n_ubatch=512,
    host_bandwidth_gbs=DEFAULT_HOST_BANDWIDTH_GBS,
    host_memory_gib=DEFAULT_HOST_MEMORY_GIB,
    enforce_eager=False,
    flashinfer_sampler=False,
    max_batched_tokens=mem.VLLM_MAX_BATCHED_TOKENS,
    max_num_seqs=mem.VLLM_MAX_NUM_SEQS,
    cpu_repack=0.0,
    cpu_repack_weights=None,
    cpu_float_weights=0.0,
    cpu_q8_weights=0.0,
    cpu_generic_bytes=0.0,
    kquant_low_weights=0.0,
    cublas_dequant=False,
    expert_tile=None,
    logits_all=False,
    with_max_context: bool = True,
) -> dict[str, np.ndarray]:
    """Evaluate the model over broadcastable arrays; returns arrays keyed by quantity (bytes, s).

    ``kind`` is the device kind ("gpu", "unified", "cpu"); ``prompt_depth`` the tokens already in the KV cache when
    the prompt is processed (prefill only: its attention reads them); ``logits_all`` whether the prompt's every token
    is scored (llama-perplexity: the LM head on every token, and on a discrete GPU their logits copied to the host;
    prefill only); ``offload_fraction`` is the share of the
    repeating layers kept in host memory (llama.cpp layers; vLLM cpu_offload_gb). ``enforce_eager``
    (vLLM) drops the CUDA-graph pool; there are no CUDA graphs on a CPU device either. ``flashinfer_sampler``
    (vLLM on a GPU): the sampler was FlashInfer's top-k/top-p kernel (the log's "Using FlashInfer for top-p & top-k
    sampling"), which samples without sorting the logits, so the profile run holds none of the sort's buffers
    (``vllm_sampler_copies``), only the logits.
    On a CPU device, llama.cpp multiplies its layer matrices on three paths (``predictor.weights.cpu_kernel_mix``,
    per quant): ``cpu_repack`` is the share of their bytes it repacks (an extra copy in memory), and
    ``cpu_repack_weights`` (default: the same share) of their weights; ``cpu_float_weights`` the share in
    F16/BF16/F32 (llamafile's GEMM, at ``prefill_f16_efficiency``), ``cpu_q8_weights`` in Q8_0 (its generic dot
    product, ``prefill_q8_flops_per_weight``); the rest take the generic quantized path
    (``prefill_generic_flops_per_weight``), and their share of the bytes, ``cpu_generic_bytes``, unpacks at
    ``decode_generic_flops_per_byte`` more per byte in decode. ``kquant_low_weights``: the share of the layer
    weights in Q2_K / Q3_K tensors (``predictor.weights.low_bit_kquant_share``), which a discrete GPU's decode
    unpacks at ``decode_kquant_flops_per_weight`` operations per weight.
    ``cublas_dequant``: the run's llama.cpp CUDA build dequantized quantized weights to FP16 for cuBLAS in
    prefill (its log says ``CUDA_USE_TENSOR_CORES: yes``; builds before PR #8075, June 2024). Calibration sets
    it from imported logs; a prediction sets it for a build of an era whose CUDA path it was
    (:func:`predictor.eras.cublas_dequant`: ``predict --engine-build 2843`` on an NVIDIA GPU).
    ``expert_tile``: the token columns of the tiles the llama.cpp backend multiplies a mixture of experts' routed
    experts in during prefill (``predictor.backends``; None or NaN: none, the experts priced as dense matmuls).
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
    # all ranks' KV together: vLLM's tensor parallelism replicates KV heads fewer than its ranks, and MLA's latent
    kv_copies = mem.kv_replicas(arch, n_dev, engine)
    kv_total = mem.kv_cache_bytes(arch, context, batch, kv_bytes_per_element, engine) * kv_copies
    kv_host_share = frac if et.layer_offload else 0.0  # llama.cpp keeps KV with its layer
    dev_kv = kv_total * (1.0 - kv_host_share)
    eager = np.logical_or(np.asarray(enforce_eager, bool), kind == "cpu")
    # vLLM's batch budget (its profile run's size) and, on a GPU, its sampler's warm-up buffers
    sorts = np.logical_and(on_gpu, np.logical_not(np.asarray(flashinfer_sampler, bool)))
    # (and whether its activations are the profile's peak, as torch counts on a GPU: mem.runtime_bytes)
    budget = (max_batched_tokens, max_num_seqs, np.where(sorts, coeffs["vllm_sampler_copies"], 0.0), on_gpu)
    runtime = mem.runtime_bytes(arch, engine, coeffs, context, n_ubatch, flash_attn, batch, eager, *budget) * n_dev
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
    # decode follows the prompt: its context is the prompt and what was in the cache before it
    ctx_now = np.minimum(_arr(prompt_tokens) + _arr(prompt_depth), _arr(context))
    # Weights streamed per step: the active layers and the LM head; the part on the host is read there.
    step_w = tp.decode_weight_bytes_per_step(arch, total_w, batch, bits_per_weight, bits_per_weight_non_expert)
    step_dev = (1.0 - frac) * (step_w - out_w) + np.where(out_on_device, out_w, 0.0)
    kv_read = mem.kv_cache_bytes(arch, ctx_now, batch, kv_bytes_per_element, "llama.cpp") * kv_copies
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
    step_params_dev = tp.decode_params_per_step(arch, batch) * step_dev / np.maximum(step_w, 1.0)
    unpack_w = np.where(quantized & (kind == "unified"), step_params_dev, 0.0)
    # Weights of the step in low-bit K-quant tensors a discrete GPU's matrix-vector kernels unpack.
    kquant_w = np.where(quantized & on_gpu, step_params_dev * np.asarray(kquant_low_weights, float), 0.0)
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
        kquant_weights=kquant_w,
    )
    cpu_llama = (kind == "cpu") & et.cpu_kernel_paths
    layer_params = arch.params_active - tp.lm_head_params(arch)
    # a mixture of experts' routed expert weights one token multiplies; on the CPU, those in F16/BF16 go through
    # mul_mat_id's dot products, not llamafile's GEMM (the float tensors' share of them taken as of all layers)
    routed = tp.routed_params_per_token(arch)
    expert_share = min(1.0, routed / layer_params) if layer_params > 0 else 0.0
    floats_cpu = np.asarray(cpu_float_weights, float)
    prefill_s = tp.prefill_seconds(
        arch,
        coeffs,
        prompt_tokens=prompt_tokens,
        prompt_depth=prompt_depth,
        logits_all=logits_all,
        logits_to_host=on_gpu,
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
            - floats_cpu - np.asarray(cpu_q8_weights, float))), 0.0),
        q8_weights=np.where(cpu_llama, layer_params * np.asarray(cpu_q8_weights, float), 0.0),
        float_share=np.where(cpu_llama, floats_cpu * (1.0 - expert_share), 0.0),
        vecdot_weights=np.where(cpu_llama, routed * floats_cpu, 0.0),
        expert_tile=expert_tile,
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
                                             kv_bytes_per_element, batch, n_ubatch, flash_attn, eager, budget)
    return result


def _max_context(arch, engine, coeffs, usable, dev_w, frac, n_dev, kv_bpe, batch, n_ubatch, flash_attn, eager,
                 budget=(mem.VLLM_MAX_BATCHED_TOKENS, mem.VLLM_MAX_NUM_SEQS, 0.0, True)):
    """Largest context (multiple of 256, up to the model's maximum) whose total stays "fits"."""
    kv_share = frac if traits(engine).layer_offload else 0.0

    def total_at(ctx):
        kv = (mem.kv_cache_bytes(arch, ctx, batch, kv_bpe, engine) * mem.kv_replicas(arch, n_dev, engine)
              * (1.0 - kv_share))
        rt = mem.runtime_bytes(arch, engine, coeffs, ctx, n_ubatch, flash_attn, batch, eager, *budget) * n_dev
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





def predict(
    model: str | ModelArch,
    device: str | Device,
    quant: str | None = None,
    context: int = DEFAULT_CONTEXT,
    engine: str = "llama.cpp",
    *,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    prompt_depth: int = 0,
    batch: int = 1,
    kv_dtype: str | None = None,
    device_count: int = 1,
    offload_fraction: float = 0.0,
    flash_attn: bool = True,
    n_ubatch: int = DEFAULT_N_UBATCH,
    coefficients: str | Path | Coefficients | None = "default",
    host_bandwidth_gbs: float | None = None,
    host_memory_gib: float | None = None,
    enforce_eager: bool = False,
    launch: bool = True,
    engine_build: str | int | None = None,
    gpu_memory_utilization: float | None = None,
) -> Estimate:
    """Predict memory, fit and throughput for one configuration: :func:`predict_scenario` of the
    :class:`~predictor.scenario.Scenario` these arguments describe (see there for their meaning)."""
    scenario = Scenario(
        model=model, device=device, engine=engine, quant=quant, context=context, prompt_tokens=prompt_tokens,
        prompt_depth=prompt_depth, batch=batch, kv_dtype=kv_dtype, flash_attn=flash_attn, n_ubatch=n_ubatch,
        offload_fraction=offload_fraction, device_count=device_count, engine_build=engine_build,
        host_bandwidth_gbs=host_bandwidth_gbs, host_memory_gib=host_memory_gib, enforce_eager=enforce_eager, gpu_memory_utilization=gpu_memory_utilization)
    return predict_scenario(scenario, coefficients, launch=launch)


def offload_that_runs(max_gpu_layers: float, num_layers: int) -> float:
    """The share of the layers kept in host RAM when the most layers that fit stay on the device."""
    return 1.0 - min(max_gpu_layers, num_layers) / num_layers


def predict_scenario(
    scenario: Scenario,
    coefficients: str | Path | Coefficients | None = "default",
    *,
    launch: bool = True,
) -> Estimate:
    """Predict memory, fit and throughput for one scenario.

    ``scenario.device`` is a catalogue id/name or a :class:`Device` (use ``predictor.devices.cpu_device`` for
    the host CPU). ``scenario.quant`` defaults to the GGUF's own type, the format the release ships in (gpt-oss:
    MXFP4), or the engine's default format (Q4_K_M for llama.cpp, BF16 for vLLM). ``coefficients``: a path, a loaded table, ``None`` for engine defaults, or
    ``"default"`` for the committed calibration table when present. ``scenario.engine_build``: the engine build
    (llama.cpp build number) or version (vLLM) to predict for; its era's fitted values are used (default: the
    newest era with data). ``scenario.gpu_memory_utilization``: vLLM's share of the device its KV pool is sized
    from (default 0.92, as ``vllm serve``).
    """
    s = scenario
    eng, arch, dev = normalize_engine(s.engine), scenario_arch(s), scenario_device(s)
    arch = validate_scenario(s, arch, dev, eng)
    if isinstance(coefficients, Coefficients):
        table = coefficients
    elif coefficients == "default":
        table = default_coefficients()
    else:
        table = load_coefficients(coefficients)
    era = era_for_build(eng, s.engine_build).id if s.engine_build is not None else table.newest_era(eng, dev.kind)
    inputs = scenario_inputs(s, arch, dev, eng)
    cset = table.lookup(eng, dev.id, dev.family, era, dev.kind, dev,
                        backend=inputs.backend.id if inputs.backend is not None else None)
    require_bits(inputs.quant, inputs.weights_bytes)

    # a build of an era whose CUDA prefill dequantized quantized weights for cuBLAS is priced with that copy
    # (and a backend that takes that path on the device's architecture in every build: CUDA on Volta)
    through_cublas = cublas_dequant(eng, era, dev) or bool(inputs.kwargs.get("cublas_dequant"))

    def run(offload: float, **extra: Any) -> dict[str, Any]:
        return evaluate(arch, eng, cset, **{**inputs.kwargs, "offload_fraction": offload,
                                            "cublas_dequant": through_cublas}, **extra)

    values = run(s.offload_fraction)
    scalars = {k: float(np.asarray(val).reshape(-1)[0]) for k, val in values.items()}
    throughput_offload = float(s.offload_fraction)
    if VERDICTS[int(scalars["verdict"])] == "needs offload" and s.offload_fraction == 0:
        # Memory and verdict describe the configuration asked for; the speeds describe the one that
        # runs: the most layers that fit on the device, the rest in host RAM.
        throughput_offload = offload_that_runs(scalars["max_gpu_layers"], arch.num_layers)
        rerun = run(throughput_offload, with_max_context=False)
        for key in ("decode_step_s", "decode_tok_s", "decode_tok_s_total", "prefill_s", "prefill_tok_s", "ttft_s"):
            scalars[key] = float(np.asarray(rerun[key]).reshape(-1)[0])
        scalars["recommended_offload_bytes"] = float(np.asarray(rerun["offload_bytes"]).reshape(-1)[0])
    q, host_bw = inputs.quant, inputs.kwargs["host_bandwidth_gbs"]
    context, batch, device_count, prompt_tokens = s.context, s.batch, s.device_count, s.prompt_tokens
    offload_fraction, flash_attn, n_ubatch, engine_build = s.offload_fraction, s.flash_attn, s.n_ubatch, s.engine_build
    est = Estimate(
        model=arch, device=dev, quant=q, engine=eng, context=int(context), batch=int(batch), kv_dtype=inputs.kv.id,
        device_count=int(device_count), prompt_tokens=int(prompt_tokens), offload_fraction=float(offload_fraction),
        flash_attn=bool(flash_attn), n_ubatch=int(n_ubatch), coefficients=cset, values=scalars,
        prompt_depth=int(s.prompt_depth),
        backend=inputs.backend.id if inputs.backend is not None else None, backend_default=not s.backend,
        expert_tile=_tile(inputs.kwargs.get("expert_tile")),
        weights_source=inputs.weights_source, host_bandwidth_gbs=host_bw, throughput_offload_fraction=throughput_offload,
        era=era_description(eng, dev.kind, era, engine_build, cset, overlay=bool(table.era_overlay(eng, era, dev.kind)),
                            device=dev),
    )
    est.evidence = evidence_level(cset, table, eng, dev.id, dev.kind, est.backend, q.id)
    est.serving = kv_pool(est, s.gpu_memory_utilization or mem.VLLM_GPU_MEMORY_UTILIZATION,
                          inputs.kwargs["max_num_seqs"], bool(s.enforce_eager), bool(s.flashinfer_sampler))
    if launch:
        est.launch = launch_commands(est, predict)
    return est


def _tile(value) -> int | None:
    """An expert tile width as the estimate keeps it (None where the backend's is not modelled)."""
    return None if value is None or not np.isfinite(value) else int(value)
