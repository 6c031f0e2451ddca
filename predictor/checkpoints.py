"""Checkpoints on disk: a Hugging Face model directory (config.json + safetensors) or a GGUF file, read
without loading weights, into a :class:`~predictor.architecture.ModelArch` with its exact weight bytes.

- :func:`from_hf_dir` is :func:`~predictor.architecture.from_hf_config` plus exact checkpoint bytes from the
  safetensors index or the safetensors headers.
- :func:`from_gguf` reads a GGUF header (memory-mapped, no weights loaded): parameters are the exact sum of
  tensor element counts and ``weights_bytes_exact`` the exact sum of tensor bytes.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from predictor.architecture import (
    ModelArch,
    RopeScaling,
    from_hf_config,
    language_config,
    read_config_json,
    rope_scaling_from_config,
)
from predictor.errors import BenchcalError


def _id_from_path(path: Path) -> str:
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name
    return stem.lower().replace(" ", "-")


# ---------------------------------------------------------------------------------------------------
# Hugging Face model directory (config.json + safetensors)

_TORCH_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float8_e4m3fn": "F8_E4M3"}


def safetensors_header(path: Path) -> dict:
    """The JSON header of a ``.safetensors`` file (reads the 8-byte length and the header only)."""
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise BenchcalError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > 100_000_000:
            raise BenchcalError(f"{path} is not a safetensors file (header length {header_len})")
        try:
            return json.loads(fh.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BenchcalError(f"{path} has an unreadable safetensors header") from exc


def safetensors_bytes(paths: list[Path]) -> tuple[int, str | None]:
    """(total tensor bytes, dtype holding most of them) over the given safetensors files."""
    by_dtype: dict[str, int] = {}
    for path in paths:
        for name, info in safetensors_header(path).items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + int(end) - int(start)
    total = sum(by_dtype.values())
    return total, (max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None)


def _checkpoint_quant(cfg: dict) -> str | None:
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        return str(quant["quant_method"]).upper()
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or language_config(cfg).get("torch_dtype")
    return _TORCH_DTYPE_NAMES.get(str(dtype)) if dtype else None


def from_hf_dir(path: str | Path) -> ModelArch:
    """A local Hugging Face model directory: config.json plus exact weight bytes from
    ``model.safetensors.index.json`` (``metadata.total_size``) or the ``*.safetensors`` headers.

    The bytes are the checkpoint's as stored: a checkpoint that also stores a tied ``lm_head`` counts it,
    although engines skip loading it when ``tie_word_embeddings`` is true."""
    root = Path(path)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise BenchcalError(f"{root} has no config.json (expected a Hugging Face model directory)")
    cfg = read_config_json(config_path)
    exact, quant = None, _checkpoint_quant(cfg)
    index = root / "model.safetensors.index.json"
    shards = sorted(root.glob("*.safetensors"))
    if index.is_file():
        meta = read_config_json(index).get("metadata") or {}
        exact = int(meta["total_size"]) if meta.get("total_size") else None
    if exact is None and shards:
        exact, dtype = safetensors_bytes(shards)
        quant = quant if cfg.get("quantization_config") else (dtype or quant)
    return from_hf_config(cfg, id=_id_from_path(root), name=root.name, source=str(config_path),
                          weights_bytes_exact=exact, weights_quant=quant if exact else None)


# ---------------------------------------------------------------------------------------------------
# GGUF

# llama.cpp's default interleaved sliding-window layouts (src/models/<arch>.cpp load_swa_pattern, unless
# the GGUF carries {arch}.attention.sliding_window_pattern; src/llama-hparams.cpp set_swa_pattern):
# layer il is sliding when il % N < N - 1.
_GGUF_SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4}


def _gguf_type_name(file_type: int | None) -> str | None:
    """llama.cpp's LLAMA_FTYPE number -> "Q4_K_M", "F16", ... (names from gguf.LlamaFileType)."""
    if file_type is None:
        return None
    import gguf

    try:
        name = gguf.LlamaFileType(int(file_type)).name
    except ValueError:
        return f"FTYPE_{file_type}"
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


class _GGUFMeta:
    """Key/value access to a GGUF header via gguf.GGUFReader (the file is memory-mapped)."""

    def __init__(self, path: Path):
        try:
            import gguf
        except ImportError as exc:  # pragma: no cover - gguf is a dependency
            raise BenchcalError("reading .gguf files needs the 'gguf' package (pip install gguf)") from exc
        try:
            self.reader = gguf.GGUFReader(str(path), "r")
        except (ValueError, OSError, IndexError, struct.error) as exc:
            raise BenchcalError(f"{path} is not a readable GGUF file: {exc}") from exc
        self.path = path
        self.arch = str(self.value("general.architecture") or "")
        if not self.arch:
            raise BenchcalError(f"GGUF {path} has no general.architecture")

    def value(self, key: str) -> Any:
        field = self.reader.get_field(key)
        return None if field is None else field.contents()

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        value = self.value(f"{self.arch}.{suffix}")
        return default if value is None else value

    def need(self, suffix: str) -> Any:
        value = self.value(f"{self.arch}.{suffix}")
        if value is None:
            raise BenchcalError(f"GGUF {self.path} is missing metadata '{self.arch}.{suffix}'")
        return value


def _first_int(value: Any) -> int:
    """Per-layer arrays (some GGUFs store head counts per layer) -> the largest entry."""
    if isinstance(value, list):
        return int(max(value)) if value else 0
    return int(value)


def _gguf_sliding_layers(meta: _GGUFMeta, num_layers: int) -> list[bool]:
    pattern = meta.arch_value("attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == num_layers:
        return [bool(x) for x in pattern]
    if not meta.arch_value("attention.sliding_window"):
        return [False] * num_layers
    n = int(pattern) if isinstance(pattern, int) else _GGUF_SWA_PATTERNS.get(meta.arch, 0)
    return [n > 0 and i % n < n - 1 for i in range(num_layers)]


def _gguf_rope_scaling(meta: Any, context_length: int, source: str) -> RopeScaling | None:
    """The RoPE scaling a GGUF enables (``<arch>.rope.scaling.type`` yarn or linear, ``.factor``,
    ``.original_context_length``, as llama.cpp's converter writes a config's ``rope_scaling``); llama.cpp applies it
    as loaded, so it counts as the file's own (``in_config``)."""
    kind = str(meta.arch_value("rope.scaling.type", "") or "").lower()
    try:
        factor = float(meta.arch_value("rope.scaling.factor", 0) or 0)
    except (TypeError, ValueError):
        return None
    if kind not in ("yarn", "linear") or not math.isfinite(factor) or factor <= 1:
        return None
    original = int(meta.arch_value("rope.scaling.original_context_length", 0) or 0) or context_length
    return rope_scaling_from_config({"rope_scaling": {"type": kind, "factor": factor,
                                                      "original_max_position_embeddings": original}},
                                    context_length, source)


def from_gguf(path: str | Path) -> ModelArch:
    """A GGUF file: shape from ``{arch}.*`` metadata, parameters and bytes from the tensor table.

    Only the header is parsed (the file is memory-mapped; tensor data is never read). For split GGUFs
    pass the first part; its tensor table covers only that part.
    """
    path = Path(path)
    meta = _GGUFMeta(path)
    tensors = meta.reader.tensors
    by_name = {t.name: t for t in tensors}
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise BenchcalError(f"GGUF {path} has no token_embd.weight tensor")

    layers = int(meta.need("block_count"))
    hidden = int(meta.need("embedding_length"))
    heads = _first_int(meta.need("attention.head_count"))
    kv_heads = _first_int(meta.arch_value("attention.head_count_kv", heads))
    head_dim = int(meta.arch_value("attention.key_length", hidden // heads))
    value_dim = int(meta.arch_value("attention.value_length", head_dim))
    vocab = int(embd.shape[1]) if len(embd.shape) > 1 else int(embd.n_elements) // hidden  # ne = [n_embd, n_vocab]
    num_experts = int(meta.arch_value("expert_count", 0) or 0)
    kv_lora = meta.arch_value("attention.kv_lora_rank")

    if kv_lora:
        rope = int(meta.arch_value("rope.dimension_count", 0))
        qk_dim = int(meta.arch_value("attention.key_length_mla", head_dim))
        v_dim = int(meta.arch_value("attention.value_length_mla", value_dim))
        kv_per_layer, flops_per_layer = int(kv_lora) + rope, 2 * heads * (qk_dim + v_dim)
        head_dim = qk_dim
    else:
        kv_per_layer, flops_per_layer = kv_heads * (head_dim + value_dim), 2 * heads * (head_dim + value_dim)

    sliding = _gguf_sliding_layers(meta, layers)
    n_window = sum(sliding)
    total = sum(int(t.n_elements) for t in tensors)
    embedding = int(embd.n_elements)
    output = int(by_name["output.weight"].n_elements) if "output.weight" in by_name else 0
    expert = sum(int(t.n_elements) for t in tensors if "_exps." in t.name)
    k = int(meta.arch_value("expert_used_count", 0) or 0) if num_experts else 0
    unselected = expert - (expert * k // num_experts if num_experts else 0)
    tied = output == 0
    name = meta.value("general.name")
    context_length = int(meta.arch_value("context_length", 0))
    rope = _gguf_rope_scaling(meta, context_length, str(path))
    return ModelArch(
        id=_id_from_path(path), name=str(name) if name else path.stem, hf_id=None, source=str(path),
        architecture=meta.arch, num_layers=layers, hidden_size=hidden,
        intermediate_size=_first_int(meta.arch_value("feed_forward_length", 0)),
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
        max_context=max(context_length, rope.max_context if rope else 0), tie_embeddings=tied, rope_scaling=rope,
        attention="mla" if kv_lora else "gqa",
        kv_elements_per_token_full=(layers - n_window) * kv_per_layer,
        kv_elements_per_token_window=n_window * kv_per_layer,
        sliding_window=int(meta.arch_value("attention.sliding_window")) if n_window else None,
        attn_flops_per_position_full=(layers - n_window) * flops_per_layer,
        attn_flops_per_position_window=n_window * flops_per_layer,
        num_experts=num_experts, experts_per_token=k,
        num_moe_layers=len({t.name.split(".")[1] for t in tensors if "_exps." in t.name and t.name.startswith("blk.")}),
        params_total=total, params_active=total - embedding - unselected + (embedding if tied else 0),
        params_embedding=embedding, params_output=output, params_expert=expert,
        published_params_b=None, published_params_source=None,
        weights_bytes_exact=sum(int(t.n_bytes) for t in tensors),
        weights_quant=_gguf_type_name(meta.value("general.file_type")),
    )
