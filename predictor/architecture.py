"""Model architecture: the shape numbers the predictor needs, derived from a config or a GGUF header.

:class:`ModelArch` is built three ways:

- :func:`from_hf_config` counts parameters from Hugging Face ``config.json`` fields (embeddings, tied or
  not; GQA or MLA attention with the biases and norms each family has; gated MLPs; MoE routed and shared
  experts with their router; dense layers before the MoE ones; norms).
- ``predictor.checkpoints.from_gguf`` reads a GGUF header (memory-mapped, no weights loaded): parameters
  are the exact sum of tensor element counts and ``weights_bytes_exact`` the exact sum of tensor bytes.
- ``predictor.checkpoints.from_hf_dir`` is :func:`from_hf_config` plus exact checkpoint bytes from the
  safetensors index or the safetensors headers.

Units: parameters are counts of weights; KV "elements" are cached scalars per token (multiply by the
KV dtype's bytes per element); attention FLOPs are per query token per attended position.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from predictor.errors import BenchcalError

ROPE_SCALING_TYPES = ("yarn", "linear", "dynamic", "llama3", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling: ``type`` (yarn, linear, dynamic, llama3, longrope) with ``factor`` over a trained window
    of ``original_max_context`` tokens, reaching ``max_context``. ``in_config``: the model's config.json enables
    it (the engines apply it as loaded); else the model card documents it as a setting to add for long inputs
    (Qwen2.5 and Qwen3: YaRN x4 from 32,768 to 131,072 tokens), and ``source`` / ``note`` cite and qualify it."""

    type: str
    factor: float
    original_max_context: int
    max_context: int
    in_config: bool
    source: str
    note: str = ""

    def describe(self) -> str:
        return f"{self.type} x{self.factor:g} from {self.original_max_context:,} to {self.max_context:,} tokens"


def rope_scaling_from_config(lang: dict, max_position: int, source: str) -> RopeScaling | None:
    """The scaling a config's ``rope_scaling`` enables (``type`` or ``rope_type``, ``factor``,
    ``original_max_position_embeddings``); None for none or one this module does not know."""
    rs = lang.get("rope_scaling")
    if not isinstance(rs, dict):
        return None
    kind = str(rs.get("rope_type") or rs.get("type") or "").lower()
    try:
        factor = float(rs.get("factor") or 0)
    except (TypeError, ValueError):
        return None
    if kind not in ROPE_SCALING_TYPES or not math.isfinite(factor) or factor <= 0:
        return None
    original = rs.get("original_max_position_embeddings")
    original = int(original) if isinstance(original, (int, float)) and original > 0 else None
    if kind in ("yarn", "linear", "dynamic") and original:
        scaled = max(int(max_position), int(original * factor))  # vLLM's derived maximum: original x factor
    else:
        scaled = int(max_position)  # llama3 / longrope configs state the scaled maximum themselves
    return RopeScaling(type=kind, factor=factor, original_max_context=original or int(max_position),
                       max_context=scaled, in_config=True, source=source)


@dataclass(frozen=True)
class ModelArch:
    """One model's architecture and parameter counts.

    ``params_active`` is the number of parameters whose weights are read to produce one token: every
    parameter except the routed experts that are not selected (E - k of E per MoE layer), except the
    input-embedding table (a lookup reads one row, counted as 0), and except ``params_extra`` (a vision
    tower is not read per generated token). The LM head is included, tied or not: a tied table is read
    in full as the output projection. For a dense untied model that is ``params_total - params_embedding``;
    for a dense tied one it is ``params_total``. Published "active" figures usually count the
    embedding table too; see :attr:`params_active_published_style`.

    ``params_extra`` counts parameters outside the language model that the published checkpoint holds
    (the Gemma 3 vision tower); they are in ``params_total`` (resident) but in no other count.
    """

    id: str
    name: str
    hf_id: str | None
    source: str
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    tie_embeddings: bool
    attention: str
    kv_elements_per_token_full: int
    kv_elements_per_token_window: int
    sliding_window: int | None
    attn_flops_per_position_full: int
    attn_flops_per_position_window: int
    num_experts: int
    experts_per_token: int
    params_total: int
    params_active: int
    params_embedding: int
    params_output: int
    params_expert: int
    published_params_b: float | None
    published_params_source: str | None
    weights_bytes_exact: int | None
    weights_quant: str | None
    params_extra: int = 0
    expert_format: str | None = None  # the checkpoint's own format of its routed experts ("MXFP4": gpt-oss)
    release_format: str | None = None  # the format the release ships in, from its quantization_config ("FP8", "MXFP4")
    rope_scaling: RopeScaling | None = None  # the config's, or one its model card documents
    long_context: bool = False  # a documented scaling enabled: ``max_context`` is then the scaled maximum
    config_max_context: int | None = None  # with ``long_context``: the config's own maximum
    # The GGUF repository the launch commands download (the catalogue's ``gguf``), and the FFN width its files
    # were converted with where it differs from the config's (Qwen pads 29,568 to 29,696 so K-quants apply).
    gguf_repo: str | None = None
    gguf_intermediate_size: int | None = None
    num_moe_layers: int = 0  # layers whose MLP is a routed mixture of experts (router, top-k, expert matmuls)

    @property
    def native_max_context(self) -> int:
        """The config's maximum, before a documented scaling that :meth:`with_long_context` enables."""
        return self.config_max_context or self.max_context

    def with_long_context(self) -> ModelArch:
        """This model with the RoPE scaling its card documents enabled (``max_context`` the scaled maximum);
        itself when the config enables its own scaling or none is documented."""
        rs = self.rope_scaling
        if rs is None or rs.in_config or self.long_context:
            return self
        return replace(self, max_context=rs.max_context, long_context=True, config_max_context=self.max_context)

    def kv_elements_per_token(self, context: Any) -> Any:
        """KV elements one sequence holds at a context of ``context`` tokens (S):
        ``kv_elements_per_token_full * S + kv_elements_per_token_window * min(S, sliding_window)``.
        Multiply by bytes per element and batch for bytes. An int gives an int; an array, an array."""
        window = self.sliding_window or 0
        if isinstance(context, (int, np.integer)):
            return int(self.kv_elements_per_token_full * context
                       + self.kv_elements_per_token_window * min(int(context), window))
        s = np.asarray(context)
        return self.kv_elements_per_token_full * s + self.kv_elements_per_token_window * np.minimum(s, window)

    def attn_flops_per_token(self, context: Any) -> Any:
        """Attention FLOPs (QK^T + AV) for one query token that attends to ``context`` positions."""
        window = self.sliding_window or 0
        s = np.asarray(context)
        flops = self.attn_flops_per_position_full * s + self.attn_flops_per_position_window * np.minimum(s, window)
        return int(flops) if np.ndim(flops) == 0 else flops

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def attention_kind(self) -> str:
        """What a user calls its attention: ``mla``; ``mha`` where every query head has its own K/V head (Llama 2,
        Code Llama, Phi-3); ``gqa`` where query heads share them (``attention`` groups both as ``gqa``, the layout
        the formulas and the GGUF tensor plan read)."""
        if self.is_mla:
            return "mla"
        return "mha" if self.num_kv_heads == self.num_attention_heads else "gqa"

    @property
    def params_non_layer(self) -> int:
        """Parameters outside the repeating layers: embeddings, LM head, final norm, ``params_extra``."""
        return self.params_embedding + self.params_output + self.params_extra + self.hidden_size

    @property
    def params_per_layer(self) -> float:
        """Mean parameters of one repeating layer (attention + MLP/MoE + norms)."""
        return (self.params_total - self.params_non_layer) / self.num_layers

    @property
    def params_active_published_style(self) -> int:
        """Active parameters the way model cards usually count them: ``params_active`` plus the
        input-embedding table (minus the LM head once more when tied, since the table is one tensor)."""
        return self.params_active + (0 if self.tie_embeddings else self.params_embedding)

    @property
    def params_total_b(self) -> float:
        return self.params_total / 1e9

    @property
    def display(self) -> str:
        """``name (id)`` for tables and messages."""
        return f"{self.name} ({self.id})"


# ---------------------------------------------------------------------------------------------------
# Hugging Face config.json


# Defaults of transformers' config classes for fields that published configs omit.
# Gemma3TextConfig: https://github.com/huggingface/transformers/blob/v4.50.0/src/transformers/models/gemma3/configuration_gemma3.py
_CONFIG_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 6,
    },
}

# Families whose transformers implementation hard-codes biases on q/k/v (not o).
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe", "qwen2_vl"}
# Families with per-head RMSNorm on q and k (weights of head_dim each).
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
# Families with four norms per layer (pre/post attention, pre/post MLP).
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}
# Families with a plain (not gated) two-matrix MLP with biases, LayerNorms with biases and biased attention
# (GPT-NeoX: Pythia; transformers' GPTNeoXLayer: query_key_value and dense with bias, dense_h_to_4h and
# dense_4h_to_h with bias, input/post-attention LayerNorm with weight and bias, final_layer_norm likewise).
_NEOX_TYPES = {"gpt_neox"}
# Families whose tie_word_embeddings defaults to True when the config omits it.
_TIED_BY_DEFAULT_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text"}
# Interleaved sliding-window families: every Nth layer is full attention (transformers' default N).
_SWA_PATTERN_DEFAULTS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}
# Families that apply ``sliding_window`` to all layers when set.
_ALL_LAYER_SWA_TYPES = {"mistral", "mixtral", "phi3", "starcoder2"}
# Families whose sliding window starts at layer ``max_window_layers`` when ``use_sliding_window``.
_QWEN_SWA_TYPES = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}


def language_config(cfg: dict) -> dict:
    """The language-model fields: ``text_config`` merged over the top level for multimodal configs,
    with transformers' class defaults filling fields the published file omits."""
    text = cfg.get("text_config")
    merged = {k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}
    if isinstance(text, dict):
        merged.update(text)
    defaults = _CONFIG_CLASS_DEFAULTS.get(str(merged.get("model_type", "")), {})
    return {**defaults, **merged}


class _Fields:
    """Typed access to one config dict; a missing required field raises a BenchcalError naming it."""

    def __init__(self, cfg: dict, source: str):
        self.cfg = cfg
        self.source = source

    def need(self, key: str) -> int:
        value = self.cfg.get(key)
        if value is None:
            raise BenchcalError(f"config.json at {self.source} is missing field '{key}'")
        return self._count(key, value, 1)

    def count(self, *keys: str, default: Any = None, minimum: int = 1) -> int:
        """The first of ``keys`` present, as a whole number of at least ``minimum`` (else ``default``)."""
        for key in keys:
            if self.cfg.get(key) is not None:
                return self._count(key, self.cfg[key], minimum)
        return default

    def _count(self, key: str, value: Any, minimum: int) -> int:
        """A size or count from config.json: a whole number in [minimum, 2**40]; BenchcalError naming it."""
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value != int(value) or not minimum <= value <= 2**40:
            what = "a positive whole number" if minimum >= 1 else "a whole number, 0 or more"
            raise BenchcalError(f"config.json at {self.source}: field '{key}' must be {what}, got {value!r}")
        return int(value)

    def get(self, *keys: str, default: Any = None) -> Any:
        for key in keys:
            if self.cfg.get(key) is not None:
                return self.cfg[key]
        return default


def _sliding_layers(f: _Fields, model_type: str, num_layers: int) -> list[bool]:
    """Per layer: True when the layer uses sliding-window attention."""
    layer_types = f.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        return [t == "sliding_attention" for t in layer_types]
    if not f.get("sliding_window"):
        return [False] * num_layers
    if model_type in _SWA_PATTERN_DEFAULTS:
        pattern = f.count("sliding_window_pattern", default=_SWA_PATTERN_DEFAULTS[model_type])
        return [(i + 1) % pattern != 0 for i in range(num_layers)]
    if model_type in _QWEN_SWA_TYPES:
        if not f.get("use_sliding_window", default=False):
            return [False] * num_layers
        first = f.count("max_window_layers", default=num_layers, minimum=0)
        return [i >= first for i in range(num_layers)]
    if model_type in _ALL_LAYER_SWA_TYPES and f.get("use_sliding_window", default=True):
        return [True] * num_layers
    return [False] * num_layers


def gated_mlp_params(hidden_size: int, intermediate_size: int, bias: bool = False) -> int:
    """Gate, up and down projections of a gated (SwiGLU/GeGLU) MLP."""
    return 3 * hidden_size * intermediate_size + ((2 * intermediate_size + hidden_size) if bias else 0)


def plain_mlp_params(hidden_size: int, intermediate_size: int, bias: bool = True) -> int:
    """Up and down projections of a non-gated (GELU) MLP, with their biases."""
    return 2 * hidden_size * intermediate_size + ((intermediate_size + hidden_size) if bias else 0)


def gqa_attention_params(hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                         qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
                         sinks: bool = False) -> int:
    """q, k, v, o projections of grouped-query attention plus the optional biases, q/k norms and sinks."""
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    weights = hidden_size * q + 2 * hidden_size * kv + q * hidden_size
    biases = (q + 2 * kv if qkv_bias else 0) + (hidden_size if o_bias else 0)
    return weights + biases + (2 * head_dim if qk_norm else 0) + (num_heads if sinks else 0)


def mla_attention_params(hidden_size: int, num_heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                         qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv projections, their norms, o_proj."""
    qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
    if q_lora_rank:
        q = hidden_size * q_lora_rank + q_lora_rank + q_lora_rank * num_heads * qk_head_dim
    else:
        q = hidden_size * num_heads * qk_head_dim
    kv_a = hidden_size * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank
    kv_b = kv_lora_rank * num_heads * (qk_nope_head_dim + v_head_dim)
    return q + kv_a + kv_b + num_heads * v_head_dim * hidden_size


def _moe_layers(f: _Fields, model_type: str, num_layers: int, num_experts: int) -> list[bool]:
    """Per layer: True when the layer's MLP is a routed mixture of experts."""
    if not num_experts:
        return [False] * num_layers
    if f.get("n_routed_experts") is not None:  # DeepSeek-V2/V3
        first_dense = f.count("first_k_dense_replace", default=0, minimum=0)
        freq = f.count("moe_layer_freq", default=1)
        return [i >= first_dense and i % freq == 0 for i in range(num_layers)]
    if model_type.startswith("qwen") and model_type.endswith("_moe"):
        step = f.count("decoder_sparse_step", default=1)
        dense = set(f.get("mlp_only_layers", default=[]))
        return [i not in dense and (i + 1) % step == 0 for i in range(num_layers)]
    return [True] * num_layers


def _moe_layer_params(f: _Fields, model_type: str, hidden: int, num_experts: int) -> tuple[int, int]:
    """(routed expert parameters, shared experts + router parameters) of one MoE layer."""
    expert_size = (f.count("moe_intermediate_size", default=0, minimum=0) or f.need("intermediate_size"))
    expert_bias = model_type == "gpt_oss"
    routed = num_experts * gated_mlp_params(hidden, expert_size, bias=expert_bias)
    router = hidden * num_experts
    if model_type == "gpt_oss" or f.get("topk_method") == "noaux_tc":
        router += num_experts  # router bias / e_score_correction_bias
    shared = 0
    if f.get("n_shared_experts"):
        shared = gated_mlp_params(hidden, expert_size * f.count("n_shared_experts", default=0, minimum=0))
    elif f.get("shared_expert_intermediate_size"):
        shared = gated_mlp_params(hidden, f.count("shared_expert_intermediate_size", default=0, minimum=0)) + hidden
    return routed, shared + router


def from_hf_config(cfg: dict, *, id: str, name: str | None = None, hf_id: str | None = None, source: str,
                   published_params_b: float | None = None, published_params_source: str | None = None,
                   params_extra: int = 0, weights_bytes_exact: int | None = None,
                   weights_quant: str | None = None, documented_rope_scaling: RopeScaling | None = None) -> ModelArch:
    """Derive a :class:`ModelArch` from a Hugging Face ``config.json`` dict (multimodal configs: the
    ``text_config`` language model; ``params_extra`` adds parameters outside it to ``params_total``;
    ``documented_rope_scaling``: a scaling the model card documents, kept when the config enables none).

    DeepSeek-V3's multi-token-prediction layer (``num_nextn_predict_layers``) is not counted: it is
    not part of the main model and engines do not load it unless speculative decoding asks for it.
    """
    if not isinstance(cfg, dict):
        raise BenchcalError(f"config.json at {source} is not a JSON object")
    model_type = str(cfg.get("model_type") or language_config(cfg).get("model_type") or "unknown")
    lang = language_config(cfg)
    text_type = str(lang.get("model_type") or model_type)
    f = _Fields(lang, source)

    layers, hidden, heads = f.need("num_hidden_layers"), f.need("hidden_size"), f.need("num_attention_heads")
    vocab, max_context = f.need("vocab_size"), f.need("max_position_embeddings")
    intermediate = f.need("intermediate_size")
    kv_heads = f.count("num_key_value_heads", default=heads)
    tied = bool(f.get("tie_word_embeddings", default=text_type in _TIED_BY_DEFAULT_TYPES))
    num_experts = f.count("num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    experts_per_token = f.count("num_experts_per_tok", "experts_per_token", default=0, minimum=0) if num_experts else 0
    if num_experts and not experts_per_token:
        raise BenchcalError(f"config.json at {source} is missing field 'num_experts_per_tok'")

    mla = f.get("kv_lora_rank") is not None
    if mla:
        kv_lora, rope = f.need("kv_lora_rank"), f.need("qk_rope_head_dim")
        nope, v_dim = f.need("qk_nope_head_dim"), f.need("v_head_dim")
        head_dim = nope + rope
        attn = mla_attention_params(hidden, heads, f.get("q_lora_rank"), kv_lora, nope, rope, v_dim)
        kv_per_layer = kv_lora + rope
        flops_per_layer = 2 * heads * head_dim + 2 * heads * v_dim
    else:
        head_dim = f.count("head_dim", default=hidden // heads)
        bias = bool(f.get("attention_bias", default=text_type in _NEOX_TYPES))
        attn = gqa_attention_params(
            hidden, heads, kv_heads, head_dim, qkv_bias=bias or text_type in _QKV_BIAS_TYPES, o_bias=bias,
            qk_norm=text_type in _QK_NORM_TYPES, sinks=text_type == "gpt_oss")
        kv_per_layer = 2 * kv_heads * head_dim
        flops_per_layer = 4 * heads * head_dim

    neox = text_type in _NEOX_TYPES
    norms = (4 if text_type in _FOUR_NORM_TYPES or neox else 2) * hidden  # LayerNorm: weight and bias
    moe_flags = _moe_layers(f, text_type, layers, num_experts)
    routed, moe_rest = _moe_layer_params(f, text_type, hidden, num_experts) if num_experts else (0, 0)
    dense_mlp = (plain_mlp_params(hidden, intermediate) if neox
                 else gated_mlp_params(hidden, intermediate, bias=bool(f.get("mlp_bias", default=False))))
    n_moe = sum(moe_flags)
    layer_params = layers * (attn + norms) + n_moe * (routed + moe_rest) + (layers - n_moe) * dense_mlp

    embedding = vocab * hidden
    output = 0 if tied else vocab * hidden
    total = embedding + output + layer_params + (2 if neox else 1) * hidden + params_extra
    expert_params = n_moe * routed
    unselected = expert_params - (expert_params * experts_per_token // num_experts if num_experts else 0)
    active = total - params_extra - embedding - unselected + (embedding if tied else 0)

    in_config = rope_scaling_from_config(lang, max_context, source)
    if in_config is not None:  # a config that enables YaRN over its trained window reaches original x factor
        max_context = max(max_context, in_config.max_context)
    sliding = _sliding_layers(f, text_type, layers)
    n_window = sum(sliding)
    window = f.count("sliding_window") if n_window else None
    return ModelArch(
        id=id, name=name or id, hf_id=hf_id, source=source, architecture=model_type,
        num_layers=layers, hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, max_context=max_context,
        tie_embeddings=tied, attention="mla" if mla else "gqa",
        kv_elements_per_token_full=(layers - n_window) * kv_per_layer,
        kv_elements_per_token_window=n_window * kv_per_layer, sliding_window=window,
        attn_flops_per_position_full=(layers - n_window) * flops_per_layer,
        attn_flops_per_position_window=n_window * flops_per_layer,
        num_experts=num_experts, experts_per_token=experts_per_token, num_moe_layers=n_moe,
        params_total=total, params_active=active, params_embedding=embedding, params_output=output,
        params_expert=expert_params, published_params_b=published_params_b,
        published_params_source=published_params_source, weights_bytes_exact=weights_bytes_exact,
        weights_quant=weights_quant, params_extra=params_extra,
        expert_format=_expert_format(cfg) if expert_params else None,
        release_format=_release_format(cfg),
        rope_scaling=in_config or documented_rope_scaling,
    )


# quantization_config.quant_method of a release -> the catalogue format it is (predictor/data/quants.json)
RELEASE_FORMATS = {"mxfp4": "MXFP4", "fp8": "FP8"}


def _release_format(cfg: dict) -> str | None:
    """The format a release ships its weights in, from its config's ``quantization_config`` (gpt-oss: ``mxfp4``,
    DeepSeek-V3: ``fp8``); None for a release in its dtype (BF16/F16) or a method the catalogue has no format for."""
    quant = cfg.get("quantization_config")
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    return RELEASE_FORMATS.get(method)


def _expert_format(cfg: dict) -> str | None:
    """"MXFP4" when the checkpoint stores its MoE experts in MXFP4 (gpt-oss: ``quantization_config``
    ``quant_method: mxfp4``, attention, router, embeddings and head left out of it)."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "mxfp4":
        return "MXFP4"
    return None


def read_config_json(path: Path) -> dict:
    """Load a config.json file; unreadable or malformed files raise BenchcalError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BenchcalError(f"cannot read config.json at {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise BenchcalError(f"config.json at {path} is not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    except UnicodeDecodeError:
        raise BenchcalError(f"config.json at {path} is not a text file (not UTF-8)") from None
    if not isinstance(data, dict):
        raise BenchcalError(f"config.json at {path} is not a JSON object")
    return data
