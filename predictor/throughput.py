"""Throughput formulas: decode step time, prefill time, TTFT.

Decode: time per step = fixed + per-layer fixed * L + per MoE layer fixed * L_moe + weight bytes / (eta_bw * BW)
+ KV bytes / (eta_kv * BW) + KV bytes * (reads - 1) * kv_reread / BW + quantized bytes * ops per byte / FLOPS
(unified-memory GPUs and the CPU, whose ALUs unpack weights at a rate close to their bandwidth:
``estimate.evaluate``) + on discrete GPUs, weights in low-bit K-quants (Q2_K, Q3_K) * ops per weight / FLOPS, where the weights are the active ones (a batch of B sequences reads them once per step),
the KV bytes are the cache at the current context and ``reads`` the number of times the engine's attention reads
each row (:func:`predictor.memory.attention_kv_read_factor`: the query heads of a group, for llama.cpp without
flash attention), the re-reads costing less than the first read where the GPU's cache holds them. Layers offloaded to
the host are read at host bandwidth. Tensor parallelism splits bytes over N devices and adds two
all-reduces per layer.

Prefill: time = fixed + per ubatch max(weights / (eta_bw * BW), matmul FLOPs / (eta_fl * FLOPS))
+ attention: FLOPs (n^2) / (eta_attn * FLOPS), or, for llama.cpp without flash attention, the f32 scores
it writes to memory / (eta_scores * BW) + for CUDA builds that multiply quantized weights through an FP16
copy and cuBLAS (before llama.cpp PR #8075, June 2024), per ubatch quantized weights x bytes per weight / BW
+ on unified-memory GPUs, per token quantized weights x unpacking operations per weight / FLOPS + on the CPU,
per token the layer weights of formats llama.cpp does not repack x operations per weight / FLOPS. Times are
seconds; inputs are scalars or arrays.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from predictor import memory as mem
from predictor.architecture import ModelArch

GB = 1e9
TFLOP = 1e12


def moe_active_fraction(arch: ModelArch, batch):
    """Share of routed-expert weights read in one decode step of ``batch`` tokens.

    With E experts and k chosen per token, B independent tokens touch E * (1 - (1 - k/E)^B)
    distinct experts per layer on average.
    """
    if not arch.num_experts:
        return np.zeros_like(np.asarray(batch, float))
    e, k = float(arch.num_experts), float(arch.experts_per_token)
    return 1.0 - (1.0 - k / e) ** np.asarray(batch, float)


def routed_params_per_token(arch: ModelArch) -> float:
    """Routed-expert parameters one token multiplies (k of E experts); 0 for a dense model."""
    return arch.params_expert * arch.experts_per_token / arch.num_experts if arch.num_experts else 0.0


def _step_params(arch: ModelArch, batch):
    """(non-expert, routed-expert) parameters one decode step of ``batch`` tokens multiplies: the active
    ones, plus the routed experts the batch touches."""
    if not arch.num_experts:
        return float(arch.params_active), np.zeros_like(np.asarray(batch, float))
    dense_active = arch.params_active - routed_params_per_token(arch)
    return dense_active, arch.params_expert * moe_active_fraction(arch, batch)


def decode_weight_bytes_per_step(arch: ModelArch, total_weights_bytes, batch, bits_per_weight=None,
                                 bits_per_weight_non_expert=None):
    """Weight bytes streamed per decode step (each part at its own width when the format quantizes the
    experts only)."""
    expert_bpp, other_bpp = mem.bytes_per_param(arch, total_weights_bytes, bits_per_weight, bits_per_weight_non_expert)
    dense, expert = _step_params(arch, batch)
    return dense * other_bpp + expert * expert_bpp


def decode_params_per_step(arch: ModelArch, batch):
    """Weights (parameters) one decode step of ``batch`` tokens multiplies."""
    dense, expert = _step_params(arch, batch)
    return dense + expert


def decode_step_seconds(
    arch: ModelArch,
    coeffs,
    *,
    device_weight_bytes,
    host_weight_bytes,
    kv_read_bytes,
    bandwidth_gbs,
    host_bandwidth_gbs,
    device_count=1,
    tensor_parallel: bool = True,
    dequant_bytes=0.0,
    tflops=None,
    kv_reread_bytes=0.0,
    generic_dequant_bytes=0.0,
    kquant_weights=0.0,
):
    """Time of one decode step (one token for each sequence of the batch), seconds.

    ``device_weight_bytes``/``host_weight_bytes``: weights streamed from device and host memory;
    ``kv_read_bytes``: KV cache read by the step (all sequences), once; ``kv_reread_bytes``: the further reads of
    the same rows by the other query heads of each group (llama.cpp without flash attention), each costing
    ``decode_kv_reread`` bytes at peak bandwidth; ``dequant_bytes``: quantized bytes
    the device unpacks in the step, each costing ``decode_dequant_flops_per_byte`` operations at the
    device's peak ``tflops`` (no term where ``tflops`` is unknown); ``generic_dequant_bytes``: the part of them on
    llama.cpp's generic CPU dot products (quantized types it neither repacks nor are Q8_0: Q5_0, Q6_K, ...), each
    costing ``decode_generic_flops_per_byte`` operations more; ``kquant_weights``: weights in Q2_K / Q3_K tensors a
    discrete GPU unpacks in the step, ``decode_kquant_flops_per_weight`` operations each at ``tflops``. Tensor
    parallelism divides the
    device bytes over ``device_count`` devices; layer split (llama.cpp) does not.
    """
    n = np.asarray(device_count, float)
    split = n if tensor_parallel else 1.0
    bw = np.asarray(bandwidth_gbs, float) * GB
    t_device = (np.asarray(device_weight_bytes, float) / split / (coeffs["decode_bw_efficiency"] * bw)
                + np.asarray(kv_read_bytes, float) / split / (coeffs["decode_kv_efficiency"] * bw)
                + np.asarray(kv_reread_bytes, float) / split * coeffs["decode_kv_reread"] / bw)
    t_host = np.asarray(host_weight_bytes, float) / (
        coeffs["host_bw_efficiency"] * np.asarray(host_bandwidth_gbs, float) * GB
    )
    # A fitted offset may be negative next to a per-layer term; the total never is.
    t_fixed = np.maximum(coeffs["decode_fixed_ms"] * 1e-3 + coeffs["decode_fixed_per_layer_us"] * 1e-6 * arch.num_layers,
                         0.0) + coeffs["decode_moe_per_layer_us"] * 1e-6 * arch.num_moe_layers
    t_comm = np.where(n > 1, 2.0 * arch.num_layers * coeffs["tp_allreduce_us"] * 1e-6, 0.0) if tensor_parallel else 0.0
    t_dequant = 0.0
    if tflops is not None:
        peak = np.asarray(tflops, float) * TFLOP
        with np.errstate(invalid="ignore", divide="ignore"):
            work = (np.asarray(dequant_bytes, float) * coeffs["decode_dequant_flops_per_byte"]
                    + np.asarray(generic_dequant_bytes, float) * coeffs["decode_generic_flops_per_byte"]
                    + np.asarray(kquant_weights, float) * coeffs["decode_kquant_flops_per_weight"])
            t_dequant = np.where(np.isfinite(peak) & (peak > 0), work / split / np.where(peak > 0, peak, 1.0), 0.0)
    return t_fixed + t_device + t_host + t_comm + t_dequant


def lm_head_params(arch: ModelArch) -> int:
    """Parameters of the output projection (the embedding table when tied)."""
    return arch.params_output or arch.params_embedding


@lru_cache(maxsize=4096)
def _padded_expert_columns(tokens: int, num_experts: int, experts_per_token: int, tile: int) -> float:
    """Expected token columns the expert matmuls of one MoE layer compute for a ubatch of ``tokens`` tokens, each
    routed to ``experts_per_token`` of ``num_experts`` experts, when an expert's tokens are computed in tiles of
    ``tile`` columns: E x T x sum_j P(X > j T), X ~ Binomial(tokens, k / E) the tokens one expert gets (routing
    taken as uniform). With ``tile`` 1 it is the routed columns themselves, tokens x k."""
    if tokens <= 0:
        return 0.0
    p = min(1.0, experts_per_token / num_experts)
    if tile <= 1 or p >= 1.0:
        return float(tokens) * num_experts * p
    x = np.arange(tokens + 1, dtype=float)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, tokens + 1, dtype=float)))))
    log_pmf = log_fact[-1] - log_fact - log_fact[::-1] + x * np.log(p) + (tokens - x) * np.log1p(-p)
    survival = 1.0 - np.cumsum(np.exp(log_pmf))  # P(X > x)
    thresholds = np.arange(0, tokens, tile)
    return float(num_experts * tile * np.clip(survival[thresholds], 0.0, 1.0).sum())


def expert_padding_factor(arch: ModelArch, ubatch_tokens, tile):
    """Columns the routed-expert matmuls compute per column routed (>= 1): a ubatch of u tokens routes u x k
    token columns to the experts, and a backend that multiplies each touched expert in tiles of ``tile`` columns
    (llama.cpp's MMQ on CUDA / ROCm: the tile that covers the whole ubatch, 128 columns, however few of its tokens
    an expert got; ``predictor/data/backends.json``) computes the padded tiles too. 1 for a dense model, a tile of
    1 or None (not modelled)."""
    u = np.asarray(ubatch_tokens, float)
    t = np.asarray(np.nan if tile is None else tile, float)
    if not arch.num_experts or not arch.experts_per_token:
        return np.ones(np.broadcast(u, t).shape)
    e, k = int(arch.num_experts), int(arch.experts_per_token)

    def one(tokens: float, width: float) -> float:
        if not np.isfinite(width) or width <= 1 or tokens < 1:
            return 1.0
        n = int(round(tokens))
        return _padded_expert_columns(n, e, k, int(width)) / (n * k)

    return np.vectorize(one, otypes=[float])(u, t)


def prefill_matmul_flops(arch: ModelArch, prompt_tokens, n_ubatch=None, expert_tile=None, logits_all=False):
    """FLOPs of the weight matmuls for a prompt of n tokens.

    2 x (active parameters - LM head) x n for the layers, plus 2 x LM head once: engines compute
    logits for the last prompt token only; with ``logits_all`` (llama-perplexity, which scores every token) the
    LM head runs on all n. The input embedding is a lookup (no FLOPs). A mixture of experts'
    routed experts compute the padded columns of :func:`expert_padding_factor` for each ubatch of ``n_ubatch``
    tokens (the last one holding the rest of the prompt) where the backend has an ``expert_tile``.
    """
    head = lm_head_params(arch)
    n = np.asarray(prompt_tokens, float)
    head_tokens = np.where(np.asarray(logits_all, bool), n, 1.0)
    flops = 2.0 * (arch.params_active - head) * n + 2.0 * head * head_tokens
    if expert_tile is None or n_ubatch is None or not arch.num_experts:
        return flops
    ub = np.maximum(np.asarray(n_ubatch, float), 1.0)
    full = np.floor(n / ub)
    rest = n - full * ub
    padded = full * ub * expert_padding_factor(arch, ub, expert_tile) + rest * expert_padding_factor(
        arch, rest, expert_tile)
    return flops + 2.0 * routed_params_per_token(arch) * (padded - n)


def _positions_attended(end, window=None):
    """Sum over the positions 0 .. end of the positions each attends to: end^2/2 under causal attention, and
    with a sliding window of W positions min(p, W) each, so W x end - W^2/2 once end passes W."""
    end = np.asarray(end, float)
    if window is None:
        return end * end / 2.0
    w = float(window)
    return np.where(end <= w, end * end / 2.0, w * end - w * w / 2.0)


def prefill_attention_flops(arch: ModelArch, prompt_tokens, prompt_depth=0.0):
    """FLOPs of causal attention over a prompt of n tokens processed after d tokens already in the cache
    (``prompt_depth``: a conversation's earlier turns; llama-bench's ``-d``): each prompt token attends to the
    positions before it, full layers ~ n x d + n^2/2 (n^2/2 from an empty cache), window layers at most W each."""
    n = np.asarray(prompt_tokens, float)
    d = np.asarray(prompt_depth, float)
    full = arch.attn_flops_per_position_full * (_positions_attended(d + n) - _positions_attended(d))
    if arch.attn_flops_per_position_window and arch.sliding_window:
        w = arch.sliding_window
        window = arch.attn_flops_per_position_window * (_positions_attended(d + n, w) - _positions_attended(d, w))
    else:
        window = 0.0
    return full + window


def prefill_seconds(
    arch: ModelArch,
    coeffs,
    *,
    prompt_tokens,
    n_ubatch,
    device_weight_bytes,
    host_weight_bytes,
    bandwidth_gbs,
    tflops,
    scores_in_memory=False,
    device_count=1,
    tensor_parallel: bool = True,
    dequant_weights=0.0,
    unpack_weights=0.0,
    generic_weights=0.0,
    float_share=0.0,
    q8_weights=0.0,
    vecdot_weights=0.0,
    prompt_depth=0.0,
    expert_tile=None,
    logits_all=False,
    logits_to_host=False,
):
    """Time to process a prompt of ``prompt_tokens`` tokens, seconds, after ``prompt_depth`` tokens already in the
    KV cache (0: from an empty cache), which its attention reads.

    Each ubatch streams the device weights once (bandwidth bound for short prompts) or is limited
    by matmul FLOPs (long prompts); host-resident layers are copied over PCIe per ubatch (llama.cpp
    runs large batches of offloaded layers on the GPU). Attention adds its n^2 FLOPs.
    ``dequant_weights``: quantized weights that each ubatch dequantizes into an FP16 buffer in device memory
    before a cuBLAS GEMM (old llama.cpp CUDA builds; 0 for current ones, whose MMQ kernels read the quantized
    weights directly), costing ``prefill_dequant_bytes_per_weight`` bytes of traffic each.
    ``unpack_weights``: quantized weights a unified-memory GPU unpacks for every prompt token (Metal's matmul
    kernels dequantize weight tiles per block of tokens), ``prefill_unpack_flops_per_weight`` operations each at
    the device's peak FLOPS. ``generic_weights``: layer weights llama.cpp's CPU backend multiplies on its generic
    path (quantized formats it does not repack), ``prefill_generic_flops_per_weight`` operations each per token
    beyond the matmul efficiency (that of the repacked GEMM kernels). ``float_share``: the share of the matmul
    FLOPs llama.cpp's CPU backend runs on F16/BF16/F32 weights (llamafile's GEMM), at
    ``prefill_f16_efficiency`` instead of ``prefill_compute_efficiency``. ``q8_weights``: layer weights in Q8_0
    on that generic path, ``prefill_q8_flops_per_weight`` operations each per token (its simplest dot product).
    ``vecdot_weights``: a mixture of experts' routed expert weights (those one token multiplies) in F16/BF16 on
    the CPU, which mul_mat_id multiplies row by column rather than with llamafile's GEMM: at
    ``prefill_compute_efficiency`` (not in ``float_share``) and ``prefill_expert_vecdot_flops_per_weight``
    operations each per token beyond it.
    ``expert_tile``: the token columns of the tiles the backend multiplies a mixture of experts' routed experts in
    (:func:`expert_padding_factor`; None or NaN: no padding).
    ``logits_all``: the logits of every prompt token are computed (llama-perplexity), not the last one's: the LM
    head's matmul on all n tokens (:func:`prefill_matmul_flops`), and where ``logits_to_host`` (a discrete GPU)
    their f32 values, 4 x vocabulary bytes a token, copied to the host at ``pcie_gbs``.
    """
    n = np.maximum(np.asarray(prompt_tokens, float), 1.0)
    ub = np.maximum(np.asarray(n_ubatch, float), 1.0)
    n_ub = np.ceil(n / ub)
    split = np.asarray(device_count, float) if tensor_parallel else 1.0
    peak = np.asarray(tflops, float) * TFLOP * split
    bw = np.asarray(bandwidth_gbs, float) * GB
    t_bw = n_ub * np.asarray(device_weight_bytes, float) / split / (coeffs["decode_bw_efficiency"] * bw)
    mm_flops = prefill_matmul_flops(arch, n, ub, expert_tile, logits_all)
    floats = np.asarray(float_share, float)
    t_mm = mm_flops * (1.0 - floats) / (coeffs["prefill_compute_efficiency"] * peak)
    if np.any(floats > 0):
        t_mm = t_mm + mm_flops * floats / (coeffs["prefill_f16_efficiency"] * peak)
    attn_flops = prefill_attention_flops(arch, n, prompt_depth)
    # Without flash attention, llama.cpp writes the f32 scores to memory and reads them back for the
    # softmax and for V: that traffic, not the FLOPs, sets the pace. One score (4 bytes) per head and
    # query-key pair, which costs 4 x head_dim FLOPs (QK^T and AV): scores bytes = FLOPs / head_dim.
    scores_bytes = attn_flops / arch.head_dim / split
    t_attn = np.where(np.asarray(scores_in_memory, bool),
                      scores_bytes / (coeffs["prefill_scores_efficiency"] * bw),
                      attn_flops / (coeffs["prefill_attn_efficiency"] * peak))
    logits_bytes = np.where(np.asarray(logits_all, bool) & np.asarray(logits_to_host, bool),
                            n * 4.0 * arch.vocab_size, 0.0)
    t_pcie = (n_ub * np.asarray(host_weight_bytes, float) + logits_bytes) / (coeffs["pcie_gbs"] * GB)
    dequant = np.asarray(dequant_weights, float)
    t_dq = n_ub * dequant / split * coeffs["prefill_dequant_bytes_per_weight"] / bw if np.any(dequant > 0) else 0.0
    unpack = np.asarray(unpack_weights, float)
    # ``peak`` is the devices' aggregate rate already (like the matmul term's).
    t_up = n * unpack * coeffs["prefill_unpack_flops_per_weight"] / peak if np.any(unpack > 0) else 0.0
    generic = np.asarray(generic_weights, float)
    t_gen = n * generic * coeffs["prefill_generic_flops_per_weight"] / peak if np.any(generic > 0) else 0.0
    q8 = np.asarray(q8_weights, float)
    t_q8 = n * q8 * coeffs["prefill_q8_flops_per_weight"] / peak if np.any(q8 > 0) else 0.0
    vd = np.asarray(vecdot_weights, float)
    t_vd = n * vd * coeffs["prefill_expert_vecdot_flops_per_weight"] / peak if np.any(vd > 0) else 0.0
    # tensor parallelism: two all-reduces a layer in each ubatch's (vLLM: each chunk's) forward, as in decode's
    # step; their latency only (the catalogue has no interconnect bandwidth to price their bytes)
    ranks = np.asarray(device_count, float)
    t_comm = (np.where(ranks > 1, n_ub * 2.0 * arch.num_layers * coeffs["tp_allreduce_us"] * 1e-6, 0.0)
              if tensor_parallel and np.any(ranks > 1) else 0.0)
    return (coeffs["prefill_fixed_ms"] * 1e-3 + np.maximum(t_bw, t_mm) + t_attn + t_pcie + t_dq + t_up + t_gen + t_q8
            + t_vd + t_comm)
