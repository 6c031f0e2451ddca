"""The tensors of a GGUF file as llama-quantize writes it: each weight's shape and GGML type, hence its bytes.

A quantization "mix" (Q4_K_M, Q8_0, ...) is not one width: llama-quantize keeps the output projection (and
tied embeddings) in Q6_K, gives some ``attn_v`` / ``ffn_down`` layers more bits, bumps the small ``attn_v``
of 80-layer models, and falls back to a 32-value block type when a row is not a multiple of 256. The
rules are llama.cpp's ``llama_tensor_get_type_impl`` and ``tensor_type_fallback`` (``src/llama-quant.cpp``)
for the mixes below, without an importance matrix except IQ4_NL / IQ4_XS, which are published with one
(without it llama-quantize gives their first eighth of ``ffn_down`` layers Q5_K, about 1% more; with one, Q4_0
and Q5_0 give theirs Q4_1 / Q5_1, about 0.5% more; the lower IQ mixes are not covered). So a file's size
follows from the architecture: Qwen2.5-72B Q4_K_M is 5.2 bits per weight (its 29568-wide ``ffn_down`` rows
fall back from Q4_K to Q5_0), Llama-3.1-8B 4.9, Qwen2.5-0.5B 6.3 (a tied 136M-parameter embedding in Q8_0).

The layout is llama.cpp's for the ``llama`` (Mistral, Mixtral, SmolLM), ``qwen2``, ``qwen3`` and
``qwen3moe`` graphs; Gemma 3 has the same matrices (plus small norm vectors). Fused-QKV (Phi-3/4),
MLA (DeepSeek) and natively-MXFP4 (gpt-oss) files are not planned here: their size stays the format's
average width. ``harness.synthetic`` writes these plans as files.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from predictor.errors import BenchcalError, suggest

# GGML type -> (values per block, bytes per block); block layouts from ggml/src/ggml-common.h.
GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
}

# File type -> (default tensor type, llama_ftype value): llama.cpp ``llama_model_quantize_impl`` and
# ``enum llama_ftype`` in include/llama.h.
FILE_TYPES: dict[str, tuple[str, int]] = {
    "F32": ("F32", 0),
    "F16": ("F16", 1),
    "BF16": ("BF16", 32),
    "Q4_0": ("Q4_0", 2),
    "Q8_0": ("Q8_0", 7),
    "Q5_0": ("Q5_0", 8),
    "Q2_K": ("Q2_K", 10),
    "Q3_K_S": ("Q3_K", 11),
    "Q3_K_M": ("Q3_K", 12),
    "Q3_K_L": ("Q3_K", 13),
    "Q4_K_S": ("Q4_K", 14),
    "Q4_K_M": ("Q4_K", 15),
    "Q5_K_S": ("Q5_K", 16),
    "Q5_K_M": ("Q5_K", 17),
    "Q6_K": ("Q6_K", 18),
    "IQ4_NL": ("IQ4_NL", 25),
    "IQ4_XS": ("IQ4_XS", 30),
}
UNQUANTIZED = ("F32", "F16", "BF16")
# A 256-block type whose row length does not divide: llama.cpp's ``tensor_type_fallback``.
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "IQ4_XS": "IQ4_NL"}
# Architectures whose GGUF holds the matrices laid out here (names normalised to [a-z0-9]).
PLANNED_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "smollm", "gemma3")
# llama.cpp's model type 70B (80 layers in the llama and qwen2 graphs) gets more bits in attn_v.
LAYERS_70B = 80


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of a GGUF file. ``shape`` in numpy (row-major) order, last dim = row length."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str

    @property
    def n_values(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        block_values, block_bytes = GGML_BLOCKS[self.ggml_type]
        return self.n_values // block_values * block_bytes


def family(architecture: Any) -> str:
    return re.sub(r"[^a-z0-9]", "", str(architecture or "llama").lower())


def gguf_architecture(spec: Mapping[str, Any]) -> str:
    """The llama.cpp graph whose tensors the plan lays out: qwen2 (qkv bias), qwen3 (q/k norm), qwen3moe,
    else llama (dense or Mixtral-style MoE). Shapes, and so bytes and speed, are the model's."""
    name = family(spec["architecture"])
    moe = int(spec.get("num_experts") or 0) > 1
    if name.startswith("qwen3"):
        return "qwen3moe" if moe else "qwen3"
    if name.startswith("qwen2") and not moe:
        return "qwen2"
    return "llama"


def layout_spec(arch: Any, ffn_width: int | None = None) -> dict[str, Any] | None:
    """The shapes a plan needs, from a ``ModelArch``; None for a layout not planned here. The FFN width is
    ``ffn_width``, else that of the files the model's GGUF repository holds (``gguf_intermediate_size``), else the
    config's."""
    if arch.attention != "gqa" or not family(arch.architecture).startswith(PLANNED_FAMILIES):
        return None
    spec = {
        "architecture": arch.architecture, "num_layers": arch.num_layers, "hidden_size": arch.hidden_size,
        "intermediate_size": ffn_width or getattr(arch, "gguf_intermediate_size", None) or arch.intermediate_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_kv_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "vocab_size": arch.vocab_size,
        "tie_embeddings": bool(arch.tie_embeddings), "num_experts": int(arch.num_experts or 0),
        "moe_intermediate_size": arch.intermediate_size,
    }
    if spec["num_experts"] > 1:
        # SwiGLU experts: gate, up and down, each hidden x expert width.
        spec["moe_intermediate_size"] = arch.params_expert // (arch.num_layers * spec["num_experts"] * 3 * arch.hidden_size)
    spec["gguf_arch"] = gguf_architecture(spec)
    return spec


# --------------------------------------------------------------------------------------- quant choices


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: first and last eighth of layers and every third in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def fallback(ggml_type: str, row_values: int) -> str:
    """llama.cpp's ``tensor_type_fallback`` for a row length the block size does not divide."""
    if row_values % GGML_BLOCKS[ggml_type][0] == 0:
        return ggml_type
    replacement = K_FALLBACK.get(ggml_type, ggml_type)
    return replacement if row_values % GGML_BLOCKS[replacement][0] == 0 else "F16"


def _is_70b(spec: Mapping[str, Any]) -> bool:
    """llama.cpp's LLM_TYPE_70B: 80 layers in the qwen2 graph, or in the llama graph with grouped KV heads."""
    if int(spec["num_layers"]) != LAYERS_70B:
        return False
    grouped = int(spec["num_kv_heads"]) != int(spec["num_attention_heads"])
    return spec.get("gguf_arch") == "qwen2" or (spec.get("gguf_arch") == "llama" and grouped)


def _attn_v(ft: str, default: str, i: int, spec: Mapping[str, Any]) -> str:
    n_layers, n_expert = int(spec["num_layers"]), int(spec.get("num_experts") or 0)
    chosen = default
    if ft == "Q2_K":
        chosen = "Q4_K" if spec["num_attention_heads"] // spec["num_kv_heads"] >= 4 else "Q3_K"
    elif ft == "Q3_K_M":
        chosen = "Q5_K" if i < 2 else "Q4_K"
    elif ft == "Q3_K_L":
        chosen = "Q5_K"
    elif ft in ("IQ4_NL", "IQ4_XS") and spec["num_attention_heads"] // spec["num_kv_heads"] >= 4:
        chosen = "Q5_K"
    elif ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n_layers):
        chosen = "Q6_K"
    elif ft == "Q4_K_S" and i < 4:
        chosen = "Q5_K"
    if _is_70b(spec) and chosen in ("Q3_K", "Q4_K"):
        chosen = "Q5_K"
    return "Q8_0" if n_expert == 8 else chosen


def _ffn_down(ft: str, default: str, i: int, n_layers: int) -> str:
    if ft == "Q2_K":
        return "Q3_K"
    if ft == "Q3_K_M":
        return "Q5_K" if i < n_layers // 16 else "Q4_K"
    if ft == "Q3_K_L":
        return "Q5_K"
    if ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n_layers):
        return "Q6_K"
    if ft == "Q4_K_S" and i < n_layers // 8:
        return "Q5_K"
    return default


def _attn_output(ft: str, default: str, n_expert: int) -> str:
    if n_expert == 8:
        return "Q5_K" if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS") else default
    return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(ft, default)


def tensor_type(role: str, i_layer: int, spec: Mapping[str, Any], file_type: str, row_values: int) -> str:
    """GGML type of one 2-D/3-D weight in a ``file_type`` file (llama.cpp ``llama_tensor_get_type_impl``)."""
    default, _ = FILE_TYPES[file_type]
    if default in UNQUANTIZED:
        return default
    n_expert = int(spec.get("num_experts") or 0)
    chosen = default
    if role == "output" or (role == "token_embd" and spec["tie_embeddings"]):
        if row_values % GGML_BLOCKS[default][0] != 0:
            chosen = "Q8_0"
        elif default != "Q8_0":
            chosen = "Q6_K"
    elif role == "attn_v":
        chosen = _attn_v(file_type, default, i_layer, spec)
    elif role == "attn_k" and n_expert == 8:
        chosen = "Q8_0"
    elif role == "ffn_down":
        chosen = _ffn_down(file_type, default, i_layer, int(spec["num_layers"]))
    elif role == "attn_output":
        chosen = _attn_output(file_type, default, n_expert)
    return fallback(chosen, row_values)


def _layer_tensors(spec: Mapping[str, Any], file_type: str, i: int) -> list[TensorPlan]:
    hidden = int(spec["hidden_size"])
    head_dim = int(spec["head_dim"])
    q_dim = int(spec["num_attention_heads"]) * head_dim
    kv_dim = int(spec["num_kv_heads"]) * head_dim
    arch = spec["gguf_arch"]
    n_expert = int(spec.get("num_experts") or 0)
    prefix = f"blk.{i}."

    def weight(role: str, suffix: str, shape: tuple[int, ...]) -> TensorPlan:
        return TensorPlan(prefix + suffix, shape, tensor_type(role, i, spec, file_type, shape[-1]))

    plans = [
        TensorPlan(prefix + "attn_norm.weight", (hidden,), "F32"),
        weight("attn_q", "attn_q.weight", (q_dim, hidden)),
        weight("attn_k", "attn_k.weight", (kv_dim, hidden)),
        weight("attn_v", "attn_v.weight", (kv_dim, hidden)),
        weight("attn_output", "attn_output.weight", (hidden, q_dim)),
        TensorPlan(prefix + "ffn_norm.weight", (hidden,), "F32"),
    ]
    if arch == "qwen2":
        plans += [TensorPlan(prefix + f"attn_{p}.bias", (d,), "F32") for p, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
    if arch in ("qwen3", "qwen3moe"):
        plans += [TensorPlan(prefix + f"attn_{p}_norm.weight", (head_dim,), "F32") for p in ("q", "k")]
    if n_expert > 1:
        ffn = int(spec["moe_intermediate_size"])
        plans += [
            TensorPlan(prefix + "ffn_gate_inp.weight", (n_expert, hidden), "F32"),
            weight("ffn_gate", "ffn_gate_exps.weight", (n_expert, ffn, hidden)),
            weight("ffn_up", "ffn_up_exps.weight", (n_expert, ffn, hidden)),
            weight("ffn_down", "ffn_down_exps.weight", (n_expert, hidden, ffn)),
        ]
    else:
        ffn = int(spec["intermediate_size"])
        plans += [
            weight("ffn_gate", "ffn_gate.weight", (ffn, hidden)),
            weight("ffn_up", "ffn_up.weight", (ffn, hidden)),
            weight("ffn_down", "ffn_down.weight", (hidden, ffn)),
        ]
    return plans


def tensor_plan(spec: Mapping[str, Any], file_type: str) -> list[TensorPlan]:
    """Every tensor of the file, in file order."""
    if file_type not in FILE_TYPES:
        raise BenchcalError(f"no llama-quantize tensor rules for {file_type!r} here (known: {', '.join(FILE_TYPES)})"
                            f"{suggest(file_type, FILE_TYPES)}")
    hidden, vocab = int(spec["hidden_size"]), int(spec["vocab_size"])
    plans = [TensorPlan("token_embd.weight", (vocab, hidden), tensor_type("token_embd", 0, spec, file_type, hidden))]
    for i in range(int(spec["num_layers"])):
        plans.extend(_layer_tensors(spec, file_type, i))
    plans.append(TensorPlan("output_norm.weight", (hidden,), "F32"))
    if not spec["tie_embeddings"]:
        plans.append(TensorPlan("output.weight", (vocab, hidden), tensor_type("output", 0, spec, file_type, hidden)))
    return plans


def weights_bytes(spec: Mapping[str, Any], file_type: str) -> int:
    """Bytes of tensor data in the file (what llama.cpp reports as the model buffer, unpadded)."""
    return sum(t.nbytes for t in tensor_plan(spec, file_type))


@functools.lru_cache(maxsize=256)  # a sweep, its report and the launch prediction ask for the same files
def planned_weights_bytes(arch: Any, quant_id: str, ffn_width: int | None = None) -> int | None:
    """Tensor bytes of ``arch``'s GGUF in the mix ``quant_id`` (the files of its GGUF repository, or with
    ``ffn_width``); None where no plan applies (layout or mix)."""
    spec = layout_spec(arch, ffn_width)
    if spec is None or quant_id not in FILE_TYPES:
        return None
    plan = tensor_plan(spec, quant_id)
    # A layout that does not hold the model's parameters (shared experts, extra projections) is not this one; a
    # repository whose files pad the FFN (``gguf_intermediate_size``) holds that many more.
    padding = 3 * arch.hidden_size * arch.num_layers * (spec["intermediate_size"] - arch.intermediate_size)
    values = sum(t.n_values for t in plan)
    if abs(values - padding - (arch.params_total - arch.params_extra)) > 1e-3 * arch.params_total:
        return None
    return sum(t.nbytes for t in plan)
