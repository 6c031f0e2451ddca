"""Memory formulas: weights, KV cache, runtime buffers, usable device memory.

Every function takes one model (``ModelArch``) and scalars or numpy arrays for the rest, so the
same formula serves one prediction and a vectorized sweep over devices, quants, contexts and
batches. Sizes are bytes unless the name says GiB.
"""

from __future__ import annotations

import numpy as np

from predictor.architecture import ModelArch
from predictor.engines import traits

GIB = float(2**30)
VLLM_MAX_BATCHED_TOKENS = 8192  # the batch budget the vLLM CPU runs' fits assume (a CPU's default, below)
VLLM_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs on most GPUs: the profile run samples this many rows
VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's default share of a device (CacheConfig.gpu_memory_utilization, 0.32.0)


def vllm_batch_defaults(device) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` of ``vllm serve`` on ``device`` when neither is given
    (``EngineArgs.get_batch_defaults``, vLLM 0.32.0, the API server's values): a device of 160 GiB or more 16,384 and
    1,024; of 70 GiB or more that is not an A100 (vLLM's PR #17885: larger budgets slowed A100s) 8,192 and 1,024;
    any other GPU 2,048 and 256. On a CPU, the budget the vLLM CPU runs' fits assume, 8,192 and 256."""
    if getattr(device, "kind", "gpu") == "cpu":
        return VLLM_MAX_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS
    memory = float(getattr(device, "memory_gib", 0.0) or 0.0)
    if memory >= 160:
        return 16384, 1024
    if memory >= 70 and "a100" not in str(getattr(device, "name", "")).lower():
        return 8192, 1024
    return 2048, 256
F32_BYTES = 4.0


def weights_bytes(arch: ModelArch, bits_per_weight, bits_per_weight_non_expert=None):
    """All weight bytes of the model in a quant format (bits per weight averaged over a real file).

    Formats that quantize only MoE experts (MXFP4) give the other parameters their own width.
    """
    bpw = np.asarray(bits_per_weight, dtype=float)
    if bits_per_weight_non_expert is None:
        return arch.params_total * bpw / 8.0
    non_expert = arch.params_total - arch.params_expert
    return (arch.params_expert * bpw + non_expert * np.asarray(bits_per_weight_non_expert, float)) / 8.0


# llama.cpp's CPU backend copies the layer matrices of these formats into an interleaved layout
# (ggml-cpu/repack.cpp: q4_0 -> q4_0_8x8, q4_K -> q4_K_8x8, iq4_nl -> iq4_nl_8x8 on AVX2; the log
# line "CPU_REPACK model buffer size"), while the memory-mapped file stays resident too.
CPU_REPACKED_QUANTS = frozenset({"Q4_0", "Q4_K_M", "Q4_K_S", "IQ4_NL"})


def cpu_repack_bytes(layer_weights_bytes, repacked_share):
    """Extra host bytes for llama.cpp's repacked copy of the layer matrices: ``repacked_share`` (0-1, array) of
    their bytes (the tensors of the types it repacks, ``predictor.weights.cpu_kernel_mix``)."""
    return np.asarray(layer_weights_bytes, float) * np.clip(np.asarray(repacked_share, float), 0.0, 1.0)


def bytes_per_param(arch: ModelArch, total_weights_bytes, bits_per_weight=None, bits_per_weight_non_expert=None):
    """(routed-expert, other) bytes per parameter of a file of ``total_weights_bytes``.

    Formats that quantize only the MoE experts (MXFP4) fix the experts' width (4.25 bits); the rest of
    the file is the other tensors (BF16 in the checkpoint, Q8_0 in some GGUF files: a file's size says
    which). Otherwise both parts have the file's average width.
    """
    total = np.asarray(total_weights_bytes, float)
    average = total / arch.params_total
    if bits_per_weight_non_expert is None or bits_per_weight is None or not arch.params_expert:
        return average, average
    expert = np.asarray(bits_per_weight, float) / 8.0
    other = (total - arch.params_expert * expert) / (arch.params_total - arch.params_expert)
    expert, other = np.broadcast_arrays(expert, np.maximum(other, 0.0))
    return expert, other


def embedding_bytes(arch: ModelArch, total_weights_bytes, bits_per_weight=None, bits_per_weight_non_expert=None):
    """Bytes of the input embedding table: the file's average width, or the non-expert width (MXFP4)."""
    _, other = bytes_per_param(arch, total_weights_bytes, bits_per_weight, bits_per_weight_non_expert)
    return arch.params_embedding * other


def output_bytes(arch: ModelArch, total_weights_bytes, bits_per_weight=None, bits_per_weight_non_expert=None):
    """Bytes of the LM head (the embedding table again when tied: engines keep a device copy)."""
    params = arch.params_output if arch.params_output else arch.params_embedding
    _, other = bytes_per_param(arch, total_weights_bytes, bits_per_weight, bits_per_weight_non_expert)
    return params * other


def kv_cache_bytes(arch: ModelArch, context, batch, kv_bytes_per_element, engine: str = "llama.cpp"):
    """KV cache for ``batch`` sequences of ``context`` tokens each.

    GQA: 2 * L * H_kv * d_head * S * B * bytes; MLA: L * (kv_lora_rank + rope_dim) * S * B * bytes;
    sliding-window layers cap at min(S, window) (all three are in ``arch.kv_elements_per_token``).
    vLLM allocates whole blocks of 16 tokens.
    """
    ctx = np.asarray(context, dtype=float)
    block = traits(engine).kv_block_tokens
    if block > 1:
        ctx = np.ceil(ctx / block) * block
    elements = arch.kv_elements_per_token(ctx)
    return elements * np.asarray(batch, float) * np.asarray(kv_bytes_per_element, float)


def kv_replicas(arch: ModelArch, device_count, engine: str = "llama.cpp"):
    """The KV bytes ``device_count`` ranks hold together over the model's KV bytes (:func:`tensor_parallel_shards`):
    1 for a layer split or one device; under vLLM's tensor parallelism the size over the KV heads where there are
    fewer heads than ranks (each rank keeps one), and the size itself for MLA's latent (whole on every rank)."""
    n = np.maximum(np.asarray(device_count, float), 1.0)
    if not traits(engine).tensor_parallel:
        return np.ones_like(n)
    if arch.is_mla:
        return n
    return np.maximum(n / max(arch.num_kv_heads, 1), 1.0)


def tensor_parallel_shards(arch: ModelArch, device_count: int, engine: str = "vllm") -> dict:
    """How vLLM splits a model's attention over ``device_count`` tensor-parallel ranks (a layer split, llama.cpp's,
    splits nothing: one rank's share is the model's). Query heads split evenly (``ModelConfig.
    verify_with_parallel_config`` refuses a size that does not divide them: :func:`tensor_parallel_refusal`); KV
    heads split while there are at least as many as ranks, else each rank holds one and the heads are replicated
    ``size / kv_heads`` times (``QKVParallelLinear``: ``num_kv_head_replicas``); MLA's latent cache
    (``kv_lora_rank + qk_rope_head_dim`` per layer) is not split by heads at all: every rank holds it whole.
    ``kv_replicas``: the KV bytes all ranks hold together over the model's KV bytes (1: no copy)."""
    n = max(int(device_count), 1)
    replicas = float(kv_replicas(arch, n, engine))
    if n == 1 or not traits(engine).tensor_parallel:
        return {"size": n, "attention_heads_per_rank": arch.num_attention_heads,
                "kv_heads_per_rank": 1 if arch.is_mla else arch.num_kv_heads, "kv_replicas": 1.0,
                "kv_split": "none" if n == 1 else "layer split: each device holds its layers' KV"}
    heads = arch.num_attention_heads // n
    if arch.is_mla:
        return {"size": n, "attention_heads_per_rank": heads, "kv_heads_per_rank": 1, "kv_replicas": replicas,
                "kv_split": "MLA latent cache whole on every rank"}
    kvh = arch.num_kv_heads
    if kvh >= n:
        return {"size": n, "attention_heads_per_rank": heads, "kv_heads_per_rank": kvh // n, "kv_replicas": 1.0,
                "kv_split": f"{kvh} KV heads split over {n} ranks"}
    return {"size": n, "attention_heads_per_rank": heads, "kv_heads_per_rank": 1, "kv_replicas": replicas,
            "kv_split": f"{kvh} KV heads, each replicated on {n // kvh} of {n} ranks"}


def tensor_parallel_refusal(arch: ModelArch, device_count: int) -> str | None:
    """Why vLLM refuses ``device_count`` tensor-parallel ranks for ``arch`` (None: it accepts them): the query
    heads must divide evenly (vLLM's own message), and the KV heads must divide by the size or the size by them
    (``QKVParallelLinear``'s ``divide``)."""
    n = int(device_count)
    if n <= 1:
        return None
    heads = arch.num_attention_heads
    if heads % n:
        return f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({n})"
    kvh = arch.num_kv_heads
    if not arch.is_mla and kvh and (kvh % n if kvh >= n else n % kvh):
        return (f"the {kvh} KV heads of {arch.id} neither split over nor replicate evenly on {n} tensor-parallel "
                "ranks")
    return None


def attention_through_memory(engine: str, flash_attn):
    """True where attention runs as ordinary matrix products: llama.cpp without flash attention. Its f32
    scores then go through memory (prefill) and each query head reads its K/V rows itself (decode);
    flash attention (llama.cpp ``-fa``) and vLLM's paged attention do neither."""
    return np.logical_and(traits(engine).attention_through_memory, np.logical_not(np.asarray(flash_attn, bool)))


def attention_kv_read_factor(arch: ModelArch, engine: str, flash_attn):
    """How many times one decode step reads each cached K/V element.

    Attention through memory (:func:`attention_through_memory`) multiplies K and V by the queries head by
    head: a grouped-query model's K/V head is read once for each of the ``num_attention_heads /
    num_kv_heads`` query heads that share it (``ggml_mul_mat`` broadcasts over the head dimension).
    Otherwise each K/V head is read once per step. MLA caches one latent per token: factor 1.
    """
    if arch.is_mla or not arch.num_kv_heads:
        return 1.0
    group = arch.num_attention_heads / arch.num_kv_heads
    return np.where(attention_through_memory(engine, flash_attn), group, 1.0)


def llama_compute_buffer_bytes(arch: ModelArch, context, n_ubatch, flash_attn, batch=1):
    """llama.cpp's compute buffer: the peak of the tensors alive together in one ubatch's graph.

    The graph allocator reuses memory, so the buffer is the largest of three phases, not their sum
    (h = one f32 hidden-state tensor, n_ubatch x d_model):

    - output: f32 logits for every token of the ubatch (n_ubatch x vocab) + 3 h;
    - FFN: the gated FFN's gate, up and product (3 x n_ubatch x d_ff, f32) + 4 h;
    - attention: without flash attention the f32 scores (n_ubatch x n_ctx x n_heads, n_ctx being the whole
      cache), with the Q/K/V tensors and their permuted copies around them: 6.5 h in the captured logs where the
      query heads are d_model wide, the Q tensor and its copy at the query heads' width where they are not
      (4.5 h + 2 q; Qwen3-30B-A3B's 32 x 128 = 2 x d_model: 162.01 MiB reported and predicted at 512 / 2,048).

    This reproduces every compute buffer llama.cpp reported (``sched_reserve: CPU compute buffer size``)
    in the committed CPU runs within 2% (but smollm2-135m Q4_0 with flash attention at 2048 tokens, 3.1%
    under) and in tests/data/llama_cpp within 4%.
    """
    ub = np.asarray(n_ubatch, dtype=float)
    hidden = ub * F32_BYTES * arch.hidden_size
    output_phase = ub * F32_BYTES * arch.vocab_size + 3.0 * hidden
    ffn_phase = ub * F32_BYTES * 3.0 * arch.intermediate_size + 4.0 * hidden
    n_ctx = np.asarray(context, float) * np.asarray(batch, float)
    scores = ub * n_ctx * arch.num_attention_heads * F32_BYTES
    # the Q tensor and its permuted copy are as wide as the query heads (Qwen3: 2 x d_model), the rest d_model
    query = ub * F32_BYTES * arch.num_attention_heads * arch.head_dim
    attention_phase = np.where(np.asarray(flash_attn, bool), 0.0, scores) + 4.5 * hidden + 2.0 * query
    return np.maximum(np.maximum(output_phase, ffn_phase), attention_phase)


def vllm_forward_bytes(arch: ModelArch, max_batched_tokens=VLLM_MAX_BATCHED_TOKENS):
    """vLLM's profile-run forward pass: one forward of ``max_batched_tokens`` tokens (16-bit), at its peak, the MLP's
    activation: the gate/up output (2 x d_ff) is still held while the activation writes its output (d_ff;
    ``LlamaMLP.forward`` in ``vllm/model_executor/models/llama.py``), beside the hidden states and residual
    (4 x d_model) per token."""
    tokens = np.asarray(max_batched_tokens, dtype=float)
    return tokens * 2.0 * (3.0 * arch.intermediate_size + 4.0 * arch.hidden_size)


def vllm_resident_forward_bytes(arch: ModelArch, max_batched_tokens=VLLM_MAX_BATCHED_TOKENS):
    """The form vLLM's activations take in a CPU's resident memory, which ``compute_buffer_scale`` (2.1 on the
    2-core host) is fitted on: ``max_batched_tokens`` x 2 x (2 d_ff + 4 d_model) bytes, the gate/up output and the
    hidden states. A fitted form, not the forward's peak: with the activation's output in it too (3 d_ff, as
    :func:`vllm_forward_bytes`), the same fit leaves qwen3-0.6b's run 11% under its measured memory."""
    tokens = np.asarray(max_batched_tokens, dtype=float)
    return tokens * 2.0 * (2.0 * arch.intermediate_size + 4.0 * arch.hidden_size)


def vllm_sampler_bytes(arch: ModelArch, max_batched_tokens=VLLM_MAX_BATCHED_TOKENS, max_num_seqs=VLLM_MAX_NUM_SEQS,
                       sampler_copies=0.0):
    """vLLM's profile-run sampler warm-up, after the forward pass: the forward's output hidden states (16-bit, one
    row per token) still held, the f32 logits of ``max_num_seqs`` rows and ``sampler_copies`` more logits-sized
    buffers (the PyTorch top-k/top-p path sorts them; 0 with FlashInfer's sort-free kernel or on a CPU)."""
    tokens = np.asarray(max_batched_tokens, dtype=float)
    logits = vllm_logits_bytes(arch, max_num_seqs)
    return tokens * 2.0 * arch.hidden_size + (1.0 + np.asarray(sampler_copies, float)) * logits


def vllm_activation_bytes(arch: ModelArch, max_batched_tokens=VLLM_MAX_BATCHED_TOKENS, max_num_seqs=VLLM_MAX_NUM_SEQS,
                          sampler_copies=0.0, forward_scale=1.0):
    """vLLM's profile-run activation peak (``profile_run`` in ``vllm/v1/worker/gpu_model_runner.py``): the forward
    pass of ``max_batched_tokens`` tokens (:func:`vllm_forward_bytes`, times ``forward_scale``), then the sampler's
    warm-up on its output (:func:`vllm_sampler_bytes`). The forward's activations are freed before the sampler runs,
    so the peak the profile measures is the larger of the two, not their sum."""
    forward = np.asarray(forward_scale, float) * vllm_forward_bytes(arch, max_batched_tokens)
    return np.maximum(forward, vllm_sampler_bytes(arch, max_batched_tokens, max_num_seqs, sampler_copies))


def vllm_logits_bytes(arch: ModelArch, max_num_seqs=VLLM_MAX_NUM_SEQS):
    """One f32 logits buffer of the profile run's sampled rows: ``max_num_seqs`` x vocabulary x 4 bytes."""
    return np.asarray(max_num_seqs, dtype=float) * arch.vocab_size * F32_BYTES


def runtime_bytes(arch: ModelArch, engine: str, coeffs, context, n_ubatch, flash_attn, batch=1,
                  enforce_eager=False, max_batched_tokens=VLLM_MAX_BATCHED_TOKENS, max_num_seqs=VLLM_MAX_NUM_SEQS,
                  sampler_copies=0.0, profile_peak=True):
    """Engine runtime on the device: fixed context + compute/activation buffers (+ vLLM CUDA graphs,
    none when ``enforce_eager``; vLLM's activations grow with its batch budget, ``max_batched_tokens`` and
    ``max_num_seqs``, and on a GPU its sampler's ``sampler_copies`` more logits-sized buffers). ``profile_peak``
    (a GPU): vLLM's activations are its profile run's peak, :func:`vllm_activation_bytes`, the larger of the
    forward pass (times ``compute_buffer_scale``) and the sampler's warm-up, as torch's allocator counts them.
    Elsewhere (a CPU, where what is measured is the process's resident memory, which keeps what the forward pass
    freed) they are :func:`vllm_resident_forward_bytes` and the logits together, times ``compute_buffer_scale``."""
    fixed = coeffs["runtime_fixed_gib"] * GIB
    scale = coeffs["compute_buffer_scale"]
    if traits(engine).profiled_runtime:
        graphs = np.where(np.asarray(enforce_eager, bool), 0.0, coeffs["vllm_graph_gib"] * GIB)
        extra = coeffs["vllm_non_torch_gib"] * GIB + graphs
        logits = vllm_logits_bytes(arch, max_num_seqs)
        resident = scale * (vllm_resident_forward_bytes(arch, max_batched_tokens) + logits) \
            + np.asarray(sampler_copies, float) * logits
        peak = vllm_activation_bytes(arch, max_batched_tokens, max_num_seqs, sampler_copies, scale)
        activations = np.where(np.asarray(profile_peak, bool), peak, resident)
        return fixed + extra + activations + np.zeros_like(np.asarray(context, float))
    return fixed + scale * llama_compute_buffer_bytes(arch, context, n_ubatch, flash_attn, batch)


def usable_device_bytes(memory_gib, usable_gib, kind, reserve_gib):
    """Memory an engine may use on one device.

    Discrete GPUs: capacity minus a reserve for driver/display. Unified-memory devices: the
    documented cap (``usable_gib``, e.g. macOS's GPU wired limit) when known, else 75% of RAM.
    The host CPU: 90% of RAM (the OS and page cache keep the rest) minus the reserve.
    """
    mem = np.asarray(memory_gib, float)
    cap = np.asarray(usable_gib, dtype=float)  # NaN where unknown
    kind = np.asarray(kind)
    reserve = np.asarray(reserve_gib, float)
    default = np.where(kind == "unified", 0.75 * mem, np.where(kind == "cpu", 0.9 * mem - reserve, mem - reserve))
    return np.where(np.isnan(cap), default, cap) * GIB
