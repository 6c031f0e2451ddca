"""Synthetic GGUF checkpoints: a catalogue architecture with random weights, for speed and memory runs.

Speed and memory of inference do not depend on the weights' values, only on their shapes and types, so a
model with the real tensor shapes and random quantized blocks measures like the real one. The file is a
``llama`` / ``qwen2`` / ``qwen3`` / ``qwen3moe`` GGUF with a byte-level vocabulary (``<unk>``, ``<s>``,
``</s>``, 256 byte tokens) padded to the architecture's vocabulary size so embeddings and the output layer
have their real shapes.

Tensors and their types are the predictor's plan of the file llama-quantize writes
(``predictor.gguf_layout``): the output tensor (or tied embeddings) in Q6_K, more bits for some ``attn_v`` /
``ffn_down`` layers in Q4_K_M, Q5_0/Q8_0 fallbacks when a row is not a multiple of 256, norms in F32.

Blocks are written directly (random quant values plus finite fp16 scales) and streamed to disk in chunks;
the whole model is never in memory. Files are cached by content hash under
``$BENCHCAL_CACHE/synthetic`` (default ``~/.cache/benchcal/synthetic``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from predictor import gguf_layout as layout
from predictor.errors import BenchcalError, suggest
from predictor.gguf_layout import TensorPlan, gguf_architecture

GENERATOR_VERSION = 2  # 2: quantized/F16 data drawn from a per-file pool of random blocks
CHUNK_BYTES = 32 * 2**20  # random data generated and written per step
ALIGNMENT_BYTES = 32  # GGUF default data alignment

# Byte offsets of the fp16 scales inside a block of each type the writer fills (ggml-common.h: block_q4_0,
# block_q5_0, block_q5_1, block_q8_0, block_q4_K, block_q5_K, block_q6_K), and GGML type ids (ggml.h).
SCALE_OFFSETS: dict[str, tuple[int, ...]] = {
    "F32": (), "F16": (), "Q4_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
GGML_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# File types whose every tensor type the writer can fill (name -> (default tensor type, llama_ftype)).
FILE_TYPES: dict[str, tuple[str, int]] = {
    name: layout.FILE_TYPES[name] for name in ("F16", "Q4_0", "Q8_0", "Q5_0", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K")
}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
SPECIAL_TOKEN_IDS = (0, 1, 2)

# Scale magnitudes that keep activations finite through many random layers (weights of std ~0.01-0.03).
_SCALE_RANGE = {
    "Q4_0": (0.002, 0.006),
    "Q5_0": (0.001, 0.003),
    "Q5_1": (0.001, 0.003),
    "Q8_0": (0.0001, 0.0003),
    "Q4_K": (0.0005, 0.002),
    "Q5_K": (0.0003, 0.001),
    "Q6_K": (0.00005, 0.0002),
}


# ------------------------------------------------------------------------------------------ architecture

SPEC_FIELDS = (
    "id", "architecture", "num_layers", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size", "max_context", "tie_embeddings",
    "num_experts", "experts_per_token", "rope_theta", "rms_norm_eps",
)
# Overridable fields (to shrink a model for tests, or give a mixture of experts another expert count) and the
# Hugging Face config.json names each may have (the first the config holds is set; else the first listed).
OVERRIDABLE: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers",),
    "vocab_size": ("vocab_size",),
    "max_context": ("max_position_embeddings",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",),
}
_EXPERT_OVERRIDES = ("num_experts", "experts_per_token")
# Families whose llama.cpp graph is the layout written here; others get the same shapes in a llama layout.
EXACT_LAYOUT_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "smollm")


def _check_overrides(overrides: Mapping[str, int] | None) -> dict[str, int]:
    checked = {}
    for key, value in (overrides or {}).items():
        if key not in OVERRIDABLE:
            raise BenchcalError(f"cannot override {key!r} of a synthetic model{suggest(key, OVERRIDABLE)}"
                                f" (can: {', '.join(OVERRIDABLE)})")
        if int(value) <= 0:
            raise BenchcalError(f"override {key} must be positive, got {value!r}")
        checked[key] = int(value)
    return checked


def apply_config_overrides(config: Mapping[str, Any], overrides: Mapping[str, int] | None) -> dict[str, Any]:
    """A copy of a Hugging Face ``config`` with synthetic ``overrides`` (:data:`OVERRIDABLE`) applied, inside its
    ``text_config`` too; ``layer_types`` lists (sliding/full pattern) are cut to a new layer count. Expert counts
    apply to a mixture of experts only, and no more experts per token than experts (BenchcalError, one line)."""
    out = json.loads(json.dumps(dict(config)))
    checked = _check_overrides(overrides)
    if not checked:
        return out
    targets = [out] + ([out["text_config"]] if isinstance(out.get("text_config"), dict) else [])
    text = targets[-1]
    if any(key in checked for key in _EXPERT_OVERRIDES):
        names = OVERRIDABLE["num_experts"]
        experts = next((int(text[n]) for n in names if text.get(n)), 0)
        if not experts:
            raise BenchcalError("num_experts / experts_per_token override a mixture of experts; "
                                "this model has no experts")
        used = checked.get("experts_per_token", int(text.get("num_experts_per_tok") or 0))
        if used > checked.get("num_experts", experts):
            raise BenchcalError(f"experts_per_token ({used}) cannot exceed num_experts "
                                f"({checked.get('num_experts', experts)})")
    for target in targets:
        for key, value in checked.items():
            names = OVERRIDABLE[key]
            if key in _EXPERT_OVERRIDES and not any(target.get(n) for n in OVERRIDABLE["num_experts"]):
                continue  # the expert counts live in the part of the config that has experts
            name = next((n for n in names if n in target), names[0])
            target[name] = value
            if key == "num_layers" and isinstance(target.get("layer_types"), list):
                target["layer_types"] = target["layer_types"][:value]
    return out


def spec_from_arch(arch: Any, overrides: Mapping[str, int] | None = None,
                   hf_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields a synthetic file needs, from a ``predictor`` ModelArch (or a mapping) and, when given,
    the model's Hugging Face config (for ``rope_theta``, ``rms_norm_eps``, ``moe_intermediate_size``)."""
    get = arch.get if isinstance(arch, Mapping) else (lambda k, d=None: getattr(arch, k, d))
    cfg = dict(hf_config or {})
    cfg = dict(cfg.get("text_config") or cfg)
    spec: dict[str, Any] = {name: get(name) for name in SPEC_FIELDS}
    if get("gguf_intermediate_size"):  # the layout of the files its GGUF repository holds (a padded FFN)
        spec["intermediate_size"] = get("gguf_intermediate_size")
    for name in ("rope_theta", "rms_norm_eps", "moe_intermediate_size"):
        spec[name] = spec[name] if spec[name] is not None else cfg.get(name)
    if get("attention") == "mla":
        raise BenchcalError(f"synthetic checkpoints do not cover MLA attention ({spec['id']}); "
                            "pass --weights PATH with a real GGUF")
    spec["architecture"] = str(spec["architecture"] or "llama")
    if not spec["head_dim"]:
        spec["head_dim"] = spec["hidden_size"] // spec["num_attention_heads"]
    spec["num_kv_heads"] = spec["num_kv_heads"] or spec["num_attention_heads"]
    spec["num_experts"] = int(spec["num_experts"] or 0)
    spec["experts_per_token"] = int(spec["experts_per_token"] or 0)
    spec["moe_intermediate_size"] = spec["moe_intermediate_size"] or spec["intermediate_size"]
    spec["tie_embeddings"] = bool(spec["tie_embeddings"])
    spec["rope_theta"] = float(spec["rope_theta"] or 10000.0)
    spec["rms_norm_eps"] = float(spec["rms_norm_eps"] or 1e-5)
    spec["max_context"] = int(spec["max_context"] or 4096)
    spec.update(_check_overrides(overrides))
    for key in ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if not spec.get(key) or int(spec[key]) <= 0:
            raise BenchcalError(f"model {spec['id']!r} lacks {key}; cannot build a synthetic checkpoint")
    if spec["vocab_size"] < len(SPECIAL_TOKENS) + 256:
        raise BenchcalError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256} for a byte vocabulary")
    spec["gguf_arch"] = gguf_architecture(spec)
    family = re.sub(r"[^a-z0-9]", "", spec["architecture"].lower())
    spec["exact_layout"] = family.startswith(EXACT_LAYOUT_FAMILIES)
    return spec


def catalogue_entry(model_id: str) -> dict[str, Any] | None:
    """The raw catalogue entry (with its Hugging Face ``config``) of a catalogue model id."""
    from predictor.models import load_catalogue_entries

    return next((dict(e) for e in load_catalogue_entries() if e["id"] == model_id), None)


def resolve_spec(model: str, overrides: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Spec for a catalogue model (any name ``predictor.models.resolve_model`` accepts)."""
    from predictor.models import resolve_model

    arch = resolve_model(model)
    entry = catalogue_entry(arch.id) or {}
    return spec_from_arch(arch, overrides, entry.get("config"))


def resolve_arch(model: str, overrides: Mapping[str, int] | None = None) -> Any:
    """The predictor's ModelArch for ``model``, rebuilt from its config with ``overrides`` applied."""
    from predictor.architecture import from_hf_config
    from predictor.models import resolve_model

    arch = resolve_model(model)
    checked = _check_overrides(overrides)
    if not checked:
        return arch
    entry = catalogue_entry(arch.id)
    if entry is None:
        raise BenchcalError(f"{model}: overrides need a catalogue model with a config")
    config = apply_config_overrides(entry["config"], checked)
    return from_hf_config(config, id=arch.id, name=arch.name, hf_id=arch.hf_id, source=entry["source"])


# ------------------------------------------------------------------------------------------ tensor plan


def tensor_plan(spec: Mapping[str, Any], file_type: str) -> list[TensorPlan]:
    """Every tensor of the synthetic file, in file order: llama-quantize's types (``predictor.gguf_layout``)."""
    if file_type not in FILE_TYPES:
        raise BenchcalError(f"synthetic checkpoints support {', '.join(FILE_TYPES)}, not {file_type!r}"
                            f"{suggest(file_type, FILE_TYPES)}")
    return layout.tensor_plan(spec, file_type)


def weights_bytes(spec: Mapping[str, Any], file_type: str) -> int:
    """Bytes of tensor data in the synthetic file (what llama.cpp reports as the model buffer, unpadded)."""
    return sum(t.nbytes for t in tensor_plan(spec, file_type))


# --------------------------------------------------------------------------------------------- writing


def _random_blocks(rng: np.random.Generator, ggml_type: str, n_blocks: int) -> np.ndarray:
    """``n_blocks`` random blocks of a quantized type as raw bytes, fp16 scales set to finite values."""
    block_bytes, scale_offsets = layout.GGML_BLOCKS[ggml_type][1], SCALE_OFFSETS[ggml_type]
    raw = np.frombuffer(rng.bytes(n_blocks * block_bytes), dtype=np.uint8).reshape(n_blocks, block_bytes).copy()
    low, high = _SCALE_RANGE[ggml_type]
    for offset in scale_offsets:
        scales = rng.uniform(low, high, n_blocks).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def _random_f16(rng: np.random.Generator, n_values: int) -> np.ndarray:
    """Random finite fp16 values of magnitude 2^-7..2^-5 (random sign and mantissa), as raw bytes."""
    bits = np.frombuffer(rng.bytes(n_values * 2), dtype=np.uint16)
    exponent = 8 + ((bits >> 10) & 1) + ((bits >> 11) & 1)
    values = (bits & 0x83FF) | (exponent.astype(np.uint16) << 10)
    return values.astype(np.uint16).view(np.uint8)


class _BlockPool:
    """Random blocks generated once per file and type, served as windows at random block offsets.

    Drawing fresh random bytes for every block made generation CPU-bound (~0.2 GB/s); windows into a
    pool of two chunks' worth keep the data random-looking and make writing disk-bound.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.pools: dict[str, np.ndarray] = {}

    def chunk(self, ggml_type: str, n_blocks: int) -> np.ndarray:
        block_values, block_bytes = layout.GGML_BLOCKS[ggml_type]
        per_chunk = max(1, CHUNK_BYTES // block_bytes)
        pool = self.pools.get(ggml_type)
        if pool is None:
            if ggml_type == "F16":
                pool = _random_f16(self.rng, 2 * per_chunk * block_values)
            else:
                pool = _random_blocks(self.rng, ggml_type, 2 * per_chunk).reshape(-1)
            self.pools[ggml_type] = pool
        start = int(self.rng.integers(0, per_chunk + 1)) * block_bytes
        return pool[start:start + n_blocks * block_bytes]


def _tensor_chunks(rng: np.random.Generator, plan: TensorPlan, pool: _BlockPool | None = None):
    """Yield the tensor's bytes in chunks of at most ``CHUNK_BYTES``."""
    if plan.ggml_type == "F32":  # norms and router weights: ones / small values
        values = np.ones(plan.n_values, dtype=np.float32)
        if plan.name.endswith("ffn_gate_inp.weight") or plan.name.endswith(".bias"):
            values = rng.uniform(-0.02, 0.02, plan.n_values).astype(np.float32)
        yield values.view(np.uint8)
        return
    pool = pool or _BlockPool(rng)
    block_values, block_bytes = layout.GGML_BLOCKS[plan.ggml_type]
    total_blocks = plan.n_values // block_values
    per_chunk = max(1, CHUNK_BYTES // block_bytes)
    for start in range(0, total_blocks, per_chunk):
        yield pool.chunk(plan.ggml_type, min(per_chunk, total_blocks - start))


def _add_metadata(writer: Any, spec: Mapping[str, Any], file_type: str) -> None:
    n_expert = int(spec.get("num_experts") or 0)
    writer.add_name(f"benchcal synthetic {spec['id']} {file_type}")
    writer.add_description("random weights with the architecture's shapes; for speed and memory measurement only")
    writer.add_context_length(int(spec["max_context"]))
    writer.add_embedding_length(int(spec["hidden_size"]))
    writer.add_block_count(int(spec["num_layers"]))
    writer.add_feed_forward_length(int(spec["intermediate_size"]))
    writer.add_head_count(int(spec["num_attention_heads"]))
    writer.add_head_count_kv(int(spec["num_kv_heads"]))
    writer.add_key_length(int(spec["head_dim"]))
    writer.add_value_length(int(spec["head_dim"]))
    writer.add_rope_dimension_count(int(spec["head_dim"]))
    writer.add_rope_freq_base(float(spec["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(spec["rms_norm_eps"]))
    writer.add_vocab_size(int(spec["vocab_size"]))
    writer.add_file_type(FILE_TYPES[file_type][1])
    writer.add_quantization_version(2)
    if n_expert > 1:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(max(1, int(spec.get("experts_per_token") or 2)))
        if spec["gguf_arch"] == "qwen3moe":
            writer.add_expert_feed_forward_length(int(spec["moe_intermediate_size"]))
    _add_byte_vocab(writer, int(spec["vocab_size"]))


def _add_byte_vocab(writer: Any, vocab_size: int) -> None:
    """SentencePiece-style byte vocabulary: specials, ``<0x00>``..``<0xFF>``, then filler tokens."""
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"<t{i}>" for i in range(len(tokens), vocab_size)]
    # gguf TokenType: NORMAL=1, UNKNOWN=2, CONTROL=3, BYTE=6
    types = np.ones(vocab_size, dtype=np.int32)
    types[0], types[1], types[2] = 2, 3, 3
    types[3:259] = 6
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(np.zeros(vocab_size, dtype=np.float32).tolist())
    writer.add_token_types(types.tolist())
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def write_synthetic_gguf(spec: Mapping[str, Any], file_type: str, path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the synthetic GGUF for ``spec`` in ``file_type`` to ``path`` (streamed; returns the path)."""
    import gguf

    plans = tensor_plan(spec, file_type)
    target = Path(path)
    writer = gguf.GGUFWriter(target, spec["gguf_arch"])
    _add_metadata(writer, spec, file_type)
    for plan in plans:
        writer.add_tensor_info(plan.name, plan.shape, np.dtype(np.float32), plan.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType(GGML_TYPE_IDS[plan.ggml_type]))
    writer.write_header_to_file(target)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = _BlockPool(rng)
    handle = writer.fout[0]
    _pad(handle)
    for plan in plans:
        written = 0
        for chunk in _tensor_chunks(rng, plan, pool):
            chunk.tofile(handle)
            written += chunk.nbytes
        if written != plan.nbytes:
            raise RuntimeError(f"wrote {written} bytes for {plan.name}, expected {plan.nbytes}")
        _pad(handle)
    handle.flush()
    os.fsync(handle.fileno())
    writer.close()
    return target


def _pad(handle: Any) -> None:
    position = handle.tell()
    padding = (-position) % ALIGNMENT_BYTES
    if padding:
        handle.write(b"\x00" * padding)


# ----------------------------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$BENCHCAL_CACHE`` or ``~/.cache/benchcal``."""
    return Path(os.environ.get("BENCHCAL_CACHE") or Path.home() / ".cache" / "benchcal").expanduser()


def content_hash(spec: Mapping[str, Any], file_type: str, seed: int) -> str:
    """Hash of everything that determines the file's bytes."""
    payload = {"spec": {k: spec.get(k) for k in (*SPEC_FIELDS, "gguf_arch") if k != "id"},
               "file_type": file_type, "generator": GENERATOR_VERSION, "seed": seed}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def synthetic_gguf(
    model: str | Mapping[str, Any],
    file_type: str,
    overrides: Mapping[str, int] | None = None,
    seed: int = 0,
    directory: str | os.PathLike[str] | None = None,
) -> Path:
    """Path of the cached synthetic GGUF for ``model`` (catalogue id or arch) in ``file_type``; builds it once."""
    spec = resolve_spec(model, overrides) if isinstance(model, str) else spec_from_arch(model, overrides)
    file_type = normalize_file_type(file_type)
    tensor_plan(spec, file_type)  # validates the file type before anything is written
    digest = content_hash(spec, file_type, seed)
    folder = Path(directory) if directory else cache_dir() / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{_slug(spec['id'])}-{file_type}-{digest[:12]}.gguf"
    if final.exists():
        return final
    remove_stale_partials(folder)
    partial = folder / f".{final.name}.{os.getpid()}.partial"
    try:
        write_synthetic_gguf(spec, file_type, partial, seed)
        os.replace(partial, final)
    finally:
        if partial.exists():
            partial.unlink()
    return final


_PARTIAL = re.compile(r"^\..+\.(\d+)\.(?:partial|tmp)$")


def remove_stale_partials(folder: Path) -> list[Path]:
    """Delete the half-written files (``.<name>.<pid>.partial`` / ``.tmp``) of writers that are gone (a process
    killed while it wrote a checkpoint); a live writer's file is left alone. Returns what was removed."""
    import psutil

    removed = []
    for path in folder.glob(".*"):
        match = _PARTIAL.match(path.name)
        if match and path.is_file() and not psutil.pid_exists(int(match.group(1))):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def normalize_file_type(name: str | None) -> str:
    """Canonical file type name (``q4_k_m`` -> ``Q4_K_M``); BenchcalError for an unsupported one."""
    canonical = str(name or "").upper().replace("-", "_")
    if canonical not in FILE_TYPES:
        raise BenchcalError(f"synthetic checkpoints support {', '.join(FILE_TYPES)}, not {name!r}"
                            f"{suggest(canonical, FILE_TYPES)}")
    return canonical


def _slug(text: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text or "model")).strip("._") or "model"
