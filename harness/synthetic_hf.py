"""Synthetic Hugging Face model directories for vLLM: a ``config.json`` and nothing else.

vLLM's ``load_format="dummy"`` builds the model from ``config.json`` and fills every weight with random
values, so a directory holding only the configuration measures speed and memory like the real checkpoint
(same tensor shapes and dtypes) without downloading it. Run with ``skip_tokenizer_init=True`` and token-id
prompts: there is no tokenizer in the directory.

The configuration comes from, in order of preference:

1. the catalogue entry's verbatim ``config`` (``predictor/data/models/<id>.json``);
2. the ``config.json`` of a local path the model spec names (a file or an HF directory);
3. a configuration rebuilt from the :class:`predictor.architecture.ModelArch` fields (dense and MoE
   GQA decoders of the llama family only).

For tests an architecture can be shrunk (``num_layers``, ``vocab_size`` overrides). Directories are cached
by content hash under ``$BENCHCAL_CACHE/synthetic-hf`` (default ``~/.cache/benchcal/synthetic-hf``); the
records of runs on them say ``weights: synthetic``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from predictor.errors import BenchcalError

GENERATOR_VERSION = 1
# Written next to config.json so a directory can be recognised as synthetic (vLLM ignores the file).
MARKER_FILE = "benchcal-synthetic.json"

# HF model_type -> the `architectures` entry vLLM resolves the model class from, for configs without one.
ARCHITECTURE_CLASSES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}

# Architectures whose config can be rebuilt from ModelArch fields alone (no catalogue or file config).
_REBUILDABLE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe")


def cache_dir() -> Path:
    """``$BENCHCAL_CACHE`` or ``~/.cache/benchcal``."""
    return Path(os.environ.get("BENCHCAL_CACHE") or Path.home() / ".cache" / "benchcal").expanduser()


def catalogue_config(model_id: str) -> dict[str, Any] | None:
    """The verbatim HF ``config`` stored with catalogue entry ``model_id``, or None when there is none."""
    path = Path(__file__).resolve().parent.parent / "predictor" / "data" / "models" / f"{model_id}.json"
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        entry = json.load(handle)
    config = entry.get("config")
    return copy.deepcopy(config) if isinstance(config, dict) else None


def _path_config(spec: str) -> dict[str, Any] | None:
    """``config.json`` read from a path spec (the file itself or a directory holding it), else None."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.name != "config.json" or not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def config_from_arch(arch: Any) -> dict[str, Any]:
    """An HF config.json rebuilt from a ModelArch (llama-family GQA decoders, dense or MoE).

    Fields the architecture does not carry (rope_theta, rms_norm_eps) take the values of the family's
    reference configs; they change neither memory nor speed.
    """
    model_type = arch.architecture
    if model_type not in _REBUILDABLE or getattr(arch, "attention", "gqa") != "gqa":
        raise BenchcalError(
            f"cannot build a synthetic vLLM model for architecture {model_type!r} without its config.json "
            f"(rebuildable: {', '.join(_REBUILDABLE)})"
        )
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE_CLASSES[model_type]],
        "model_type": model_type,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_context,
        "tie_word_embeddings": bool(arch.tie_embeddings),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0 if model_type.startswith("qwen") else 500000.0,
        "torch_dtype": "bfloat16",
    }
    if arch.num_experts:
        expert_key = "num_local_experts" if model_type == "mixtral" else "num_experts"
        config[expert_key] = arch.num_experts
        config["num_experts_per_tok"] = arch.experts_per_token
    return config


def base_config(model: str) -> dict[str, Any]:
    """The HF config for a model spec: catalogue config, then a path's config.json, then ModelArch fields."""
    from predictor.models import resolve_model

    arch = resolve_model(model)
    config = catalogue_config(arch.id) or _path_config(model)
    if config is None:
        config = config_from_arch(arch)
    if not config.get("architectures"):
        model_type = config.get("model_type", arch.architecture)
        if model_type not in ARCHITECTURE_CLASSES:
            raise BenchcalError(f"config of {model!r} has no 'architectures' and model_type {model_type!r} is unknown")
        config["architectures"] = [ARCHITECTURE_CLASSES[model_type]]
    return config


def shrink_config(config: Mapping[str, Any], overrides: Mapping[str, int] | None) -> dict[str, Any]:
    """Apply synthetic overrides (``num_layers``, ``vocab_size``, ``max_context``, a mixture of experts'
    ``num_experts`` / ``experts_per_token``; :func:`harness.synthetic.apply_config_overrides`)."""
    from harness.synthetic import apply_config_overrides

    return apply_config_overrides(config, overrides)


def content_hash(config: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical config JSON plus the generator version."""
    canonical = json.dumps({"config": config, "generator": GENERATOR_VERSION}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_hf_dir(config: Mapping[str, Any], directory: str | os.PathLike[str], source: str) -> Path:
    """Write ``config.json`` and the synthetic marker into ``directory`` atomically; return the directory."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in (
        ("config.json", dict(config)),
        (MARKER_FILE, {"weights": "synthetic", "source": source, "generator": GENERATOR_VERSION}),
    ):
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, folder / name)
    return folder


def synthetic_hf_dir(
    model: str,
    overrides: Mapping[str, int] | None = None,
    directory: str | os.PathLike[str] | None = None,
) -> Path:
    """Path of the cached config-only HF directory for ``model`` (shrunk by ``overrides``); built once.

    ``model`` is anything :func:`predictor.models.resolve_model` accepts. Load it in vLLM with
    ``load_format="dummy"``.
    """
    config = shrink_config(base_config(model), overrides)
    digest = content_hash(config)
    root = Path(directory) if directory else cache_dir() / "synthetic-hf"
    folder = root / f"{_slug(model)}-{digest[:16]}"
    if (folder / "config.json").is_file() and (folder / MARKER_FILE).is_file():
        return folder
    return write_hf_dir(config, folder, source=model)


def is_synthetic_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory written by :func:`write_hf_dir` (config only, random weights)."""
    return (Path(path) / MARKER_FILE).is_file()


def _slug(text: str) -> str:
    name = Path(text).name if os.sep in text else text
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in name.lower()).strip("-.")
    return cleaned[:48] or "model"
