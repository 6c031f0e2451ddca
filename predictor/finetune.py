"""Fine-tuning memory: QLoRA (4-bit base), LoRA (16-bit base) and full fine-tuning, component by component.

Every component is a formula over the model's configuration with a named constant and its source:

- **Base weights.** Full and LoRA: the checkpoint's parameters in BF16, 2 bytes each. QLoRA: the transformer blocks'
  linear layers in NF4 with double quantization, :data:`NF4_DQ_BITS` bits per weight (QLoRA, Dettmers et al. 2023,
  section 3: 4 bits plus 8-bit block constants per 64 weights plus FP32 second-level constants per 256 blocks); the
  embeddings, the output head and the norms stay in BF16 (bitsandbytes quantizes ``nn.Linear`` layers only and
  transformers keeps the output head out of it).
- **Full fine-tuning, mixed precision** (Hugging Face's "model memory anatomy": 6 bytes per parameter of weights, BF16
  plus an FP32 master copy; 4 bytes of FP32 gradients; 8 bytes of AdamW states, 2 with an 8-bit optimizer).
- **LoRA adapters** of rank r on every linear layer of every block (``all-linear``, as QLoRA recommends): r x (d_in +
  d_out) parameters per adapted matrix, for mixture-of-experts blocks every expert's too. PEFT casts BF16 adapters to
  FP32 (``autocast_adapter_dtype``, its default): 4 bytes of weight and 4 of gradient per adapter parameter, plus the
  optimizer's states; ``adapter_dtype="bf16"`` (QLoRA's own script) halves the first two.
- **Activations** kept for the backward pass, BF16, PyTorch's scaled-dot-product attention (no score matrix kept),
  per token: :data:`ACT_HIDDEN_BYTES` x hidden + :data:`ACT_KV_BYTES` x KV width + :data:`ACT_FFN_BYTES` x FFN width
  per block, plus the FP32 logits the loss keeps and their gradient (:data:`LOGIT_BYTES` x vocabulary) and
  :data:`ACT_NON_LAYER_HIDDEN_BYTES` x hidden outside the blocks. These constants were measured, not assumed: the
  bytes autograd saves in one training forward of transformers' Llama (``benchmarks/finetune_activations.py`` counts
  them with ``torch.autograd.graph.saved_tensors_hooks``; ``tests/test_finetune.py`` repeats the count at other
  sizes and compares). With gradient checkpointing each block keeps only its input (2 x hidden bytes per token)
  and one block's activations are recomputed at a time during the backward pass.
- **Runtime**: :data:`RUNTIME_GIB` for the CUDA context and PyTorch's allocator (uncalibrated).

Sharded across N GPUs (FSDP / ZeRO-3), weights, gradients and optimizer states divide by N; activations and the
runtime do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from predictor.architecture import ModelArch
from predictor.errors import BenchcalError

GIB = float(2**30)

METHODS = ("qlora", "lora", "full")
METHOD_LABELS = {"qlora": "QLoRA (4-bit NF4 base)", "lora": "LoRA (16-bit base)", "full": "Full fine-tuning (BF16 mixed precision)"}
# bytes of optimizer state per trainable parameter
OPTIMIZERS = {"adamw": 8.0, "paged-adamw-32bit": 8.0, "adamw-8bit": 2.0, "paged-adamw-8bit": 2.0, "sgd": 4.0}
DEFAULT_OPTIMIZER = {"qlora": "paged-adamw-32bit", "lora": "adamw", "full": "adamw"}
ADAPTER_DTYPES = {"fp32": 4.0, "bf16": 2.0}

NF4_DQ_BITS = 4.0 + 8.0 / 64 + 32.0 / (64 * 256)  # 4.127: QLoRA section 3, double quantization
BF16_BYTES = 2.0
MASTER_BYTES = 4.0  # FP32 master copy of mixed-precision training
FULL_GRAD_BYTES = 4.0  # FP32 gradients of mixed-precision training
ACT_HIDDEN_BYTES = 20.0
ACT_KV_BYTES = 4.0
ACT_FFN_BYTES = 8.0
ACT_NON_LAYER_HIDDEN_BYTES = 8.0
LOGIT_BYTES = 8.0  # FP32 logits kept by the loss (4) and their gradient at the start of the backward pass (4)
CHECKPOINT_HIDDEN_BYTES = 2.0  # a checkpointed block keeps its BF16 input only
RUNTIME_GIB = 0.5

SOURCES = {
    "nf4": "https://arxiv.org/abs/2305.14314 (QLoRA, section 3: NF4 and double quantization, 0.127 bits of constants "
           "per weight)",
    "mixed_precision": "https://huggingface.co/docs/transformers/model_memory_anatomy (mixed precision: 6 bytes/param "
                       "of weights, 4 of gradients, 8 of AdamW states, 2 with 8-bit optimizers)",
    "adapters": "https://huggingface.co/docs/peft/package_reference/lora (LoRA r x (d_in + d_out) per adapted matrix; "
                "autocast_adapter_dtype casts bf16/fp16 adapters to fp32 by default)",
    "paged": "https://github.com/artidoro/qlora/blob/86ac6016f66a84faa4b626e9cdac0fc6be992f19/README.md "
             "(--optim paged_adamw_32bit)",
    "activations": "measured: benchmarks/finetune_activations.py (bytes autograd saves in one training forward of "
                   "transformers' LlamaForCausalLM, BF16, SDPA attention)",
    "runtime": "uncalibrated: CUDA context and PyTorch allocator",
}


@dataclass(frozen=True)
class FinetuneSetup:
    method: str
    seq_len: int = 2048
    batch: int = 1
    lora_rank: int = 16
    gradient_checkpointing: bool = True
    optimizer: str | None = None  # default: DEFAULT_OPTIMIZER[method]
    adapter_dtype: str = "fp32"
    gpus: int = 1

    def validated(self) -> FinetuneSetup:
        if self.method not in METHODS:
            raise BenchcalError(f"--method takes one of {', '.join(METHODS)}, got '{self.method}'")
        optimizer = self.optimizer or DEFAULT_OPTIMIZER[self.method]
        if optimizer not in OPTIMIZERS:
            raise BenchcalError(f"--optimizer takes one of {', '.join(OPTIMIZERS)}, got '{optimizer}'")
        if self.adapter_dtype not in ADAPTER_DTYPES:
            raise BenchcalError(f"--adapter-dtype takes one of {', '.join(ADAPTER_DTYPES)}, got '{self.adapter_dtype}'")
        for name, value in (("--seq", self.seq_len), ("--batch", self.batch), ("--lora-rank", self.lora_rank),
                            ("--gpus", self.gpus)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BenchcalError(f"{name} takes a positive whole number, got {value!r}")
        return FinetuneSetup(self.method, self.seq_len, self.batch, self.lora_rank, self.gradient_checkpointing,
                             optimizer, self.adapter_dtype, self.gpus)


@dataclass(frozen=True)
class FinetuneMemory:
    """Bytes per GPU of each component (sharded ones already divided by ``setup.gpus``)."""

    setup: FinetuneSetup
    base_weights: float
    master_weights: float
    adapters: float
    gradients: float
    optimizer: float
    activations: float
    runtime: float
    trainable_params: int
    adapter_params: int
    formulas: dict[str, str]

    @property
    def total(self) -> float:
        return (self.base_weights + self.master_weights + self.adapters + self.gradients + self.optimizer
                + self.activations + self.runtime)

    def as_gib(self) -> dict[str, float]:
        return {k: round(getattr(self, k) / GIB, 3) for k in
                ("base_weights", "master_weights", "adapters", "gradients", "optimizer", "activations", "runtime",
                 "total")}


def _norm_params(arch: ModelArch) -> int:
    return 2 * arch.hidden_size * arch.num_layers + arch.hidden_size


def linear_params(arch: ModelArch) -> int:
    """Parameters in the blocks' linear layers (what QLoRA quantizes): all but embeddings, output head, norms and a
    vision tower."""
    output = 0 if arch.tie_embeddings else arch.params_output
    return max(0, arch.params_total - arch.params_embedding - output - arch.params_extra - _norm_params(arch))


def expert_ffn_width(arch: ModelArch) -> int:
    """One routed expert's FFN width, from the experts' parameter count (gate, up and down of hidden x width)."""
    if not arch.num_experts:
        return 0
    return round(arch.params_expert / (arch.num_layers * arch.num_experts * 3 * arch.hidden_size))


def adapter_params(arch: ModelArch, rank: int) -> int:
    """LoRA parameters on every linear layer of every block: r x (d_in + d_out) per matrix."""
    h, q, kv = arch.hidden_size, arch.num_attention_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = (h + q) + 2 * (h + kv) + (q + h)
    if arch.num_experts:
        ffn = arch.num_experts * 3 * (h + expert_ffn_width(arch))
    else:
        ffn = 3 * (h + arch.intermediate_size)
    return rank * arch.num_layers * (attention + ffn)


def block_activation_bytes(arch: ModelArch) -> float:
    """Bytes one block keeps for the backward pass per token, without checkpointing."""
    kv = arch.num_kv_heads * arch.head_dim
    ffn = (arch.experts_per_token * expert_ffn_width(arch)) if arch.num_experts else arch.intermediate_size
    return ACT_HIDDEN_BYTES * arch.hidden_size + ACT_KV_BYTES * kv + ACT_FFN_BYTES * ffn


def outside_activation_bytes(arch: ModelArch) -> float:
    """Bytes per token outside the blocks: embeddings and final norm, the FP32 logits and their gradient."""
    return ACT_NON_LAYER_HIDDEN_BYTES * arch.hidden_size + LOGIT_BYTES * arch.vocab_size


def activation_bytes_per_token(arch: ModelArch, gradient_checkpointing: bool) -> float:
    """Bytes kept for the backward pass per token of the batch (see the module docstring)."""
    block, outside = block_activation_bytes(arch), outside_activation_bytes(arch)
    if gradient_checkpointing:
        return CHECKPOINT_HIDDEN_BYTES * arch.hidden_size * arch.num_layers + block + outside
    return block * arch.num_layers + outside


def finetune_memory(arch: ModelArch, setup: FinetuneSetup) -> FinetuneMemory:
    s = setup.validated()
    n = s.gpus
    optimizer_bytes = OPTIMIZERS[s.optimizer]
    tokens = s.seq_len * s.batch
    act = activation_bytes_per_token(arch, s.gradient_checkpointing) * tokens
    act_formula = (f"{tokens:,} tokens x {activation_bytes_per_token(arch, s.gradient_checkpointing):,.0f} B "
                   f"({'checkpointed blocks: 2 B x hidden per block + one block recomputed' if s.gradient_checkpointing else 'every block'}"
                   f" + logits {LOGIT_BYTES:.0f} B x vocab)")
    formulas = {"activations": act_formula, "runtime": f"{RUNTIME_GIB} GiB ({SOURCES['runtime']})"}
    params = arch.params_total
    if s.method == "full":
        base = BF16_BYTES * params / n
        master = MASTER_BYTES * params / n
        grads = FULL_GRAD_BYTES * params / n
        opt = optimizer_bytes * params / n
        formulas.update({
            "base_weights": f"{params:,} params x 2 B (BF16){_per(n)}",
            "master_weights": f"{params:,} params x 4 B (FP32 master copy){_per(n)}",
            "gradients": f"{params:,} params x 4 B (FP32){_per(n)}",
            "optimizer": f"{params:,} params x {optimizer_bytes:g} B ({s.optimizer}){_per(n)}",
        })
        return FinetuneMemory(s, base, master, 0.0, grads, opt, act, RUNTIME_GIB * GIB, params, 0, formulas)
    lora = adapter_params(arch, s.lora_rank)
    adapter_bytes = ADAPTER_DTYPES[s.adapter_dtype]
    if s.method == "qlora":
        linear = linear_params(arch)
        base = (linear * NF4_DQ_BITS / 8 + (params - linear) * BF16_BYTES) / n
        formulas["base_weights"] = (f"{linear:,} linear params x {NF4_DQ_BITS:.3f} bits (NF4, double quant) + "
                                    f"{params - linear:,} params x 2 B (embeddings, head, norms){_per(n)}")
    else:
        base = BF16_BYTES * params / n
        formulas["base_weights"] = f"{params:,} params x 2 B (BF16, frozen){_per(n)}"
    formulas.update({
        "adapters": f"{lora:,} adapter params (rank {s.lora_rank}, all linear layers) x {adapter_bytes:g} B "
                    f"({s.adapter_dtype}){_per(n)}",
        "gradients": f"{lora:,} adapter params x {adapter_bytes:g} B{_per(n)}",
        "optimizer": f"{lora:,} adapter params x {optimizer_bytes:g} B ({s.optimizer}){_per(n)}",
    })
    return FinetuneMemory(s, base, 0.0, adapter_bytes * lora / n, adapter_bytes * lora / n,
                          optimizer_bytes * lora / n, act, RUNTIME_GIB * GIB, lora, lora, formulas)


def _per(n: int) -> str:
    return f" / {n} GPUs" if n > 1 else ""


SHARDS = (1, 2, 4, 8)


def sharded_totals(arch: ModelArch, setup: FinetuneSetup) -> dict[int, float]:
    """Bytes per GPU of ``setup`` sharded over each of :data:`SHARDS` GPUs (the same whatever the card)."""
    return {n: finetune_memory(arch, FinetuneSetup(**{**setup.__dict__, "gpus": n})).total for n in SHARDS}


def gpus_needed(arch: ModelArch, setup: FinetuneSetup, usable_bytes: float,
                totals: dict[int, float] | None = None) -> int | None:
    """The fewest GPUs (1, 2, 4, 8) of ``usable_bytes`` each that hold ``setup`` sharded, else None (``totals``:
    :func:`sharded_totals`, when the caller has them)."""
    totals = totals or sharded_totals(arch, setup)
    return next((n for n in SHARDS if totals[n] <= usable_bytes), None)


def gib(x: float) -> float:
    return round(x / GIB, 3) if math.isfinite(x) else float("nan")


def usable_bytes(device) -> float:
    """What a training process may use on ``device``: as for inference (:func:`predictor.memory.usable_device_bytes`,
    the engine-default driver reserve)."""
    from predictor.memory import usable_device_bytes
    from predictor.registry import REGISTRY

    reserve = REGISTRY["reserve_gib"].defaults["vllm"][0]
    return float(usable_device_bytes(device.memory_gib, device.usable_gib if device.usable_gib is not None else
                                     float("nan"), device.kind, reserve))


def recommend_devices(arch: ModelArch, setup: FinetuneSetup, devices) -> dict | None:
    """The discrete NVIDIA or AMD GPU that holds ``setup`` at the lowest purchase price (the catalogue's, where it
    has one; unpriced cards after, by memory); where none holds it alone, the fewest of one card (2, 4 or 8,
    sharded) and, among those, the same order."""
    best = None
    totals = sharded_totals(arch, setup)
    for d in devices:
        if d.kind != "gpu" or d.vendor not in ("nvidia", "amd"):
            continue
        usable = usable_bytes(d)
        n = gpus_needed(arch, setup, usable, totals)
        if n is None:
            continue
        key = (n, d.price_usd or float("inf"), d.memory_gib)
        if best is None or key < best[0]:
            best = (key, d, n, usable)
    if best is None:
        return None
    _, d, n, usable = best
    return {"device": d.id, "name": d.name, "gpus": n, "usable_gib_per_gpu": gib(usable),
            "total_gib_per_gpu": gib(totals[n])}
