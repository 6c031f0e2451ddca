"""A run's configuration before it runs: normalized and checked, the engine's defaults filled in, its weights
prepared and its log's path. Engine-free, and below the protocol (:mod:`harness.protocol`) and the host probe
(:mod:`harness.hostbench`), which both run configurations."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import records
from predictor.errors import BenchcalError

# ------------------------------------------------------------------------------------------------ config


def prepare_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize ``config`` and check what a user can get wrong; BenchcalError with one line otherwise."""
    cfg = records.normalize_config(config)
    if not cfg.get("model"):
        raise BenchcalError("a run needs a model")
    if cfg["engine"] not in records.ENGINES:
        raise BenchcalError(f"unknown engine {cfg['engine']!r} (choose from: {', '.join(records.ENGINES)})")
    for key in ("context", "reps", "batch", "device_count"):
        if int(cfg[key]) <= 0:
            raise BenchcalError(f"{key} must be positive, got {cfg[key]!r}")
    if int(cfg["warmup"]) < 0 or int(cfg["gen_tokens"]) < 0:
        raise BenchcalError("warmup and gen_tokens must be zero or positive")
    longest = max(cfg["prompt_tokens"] or [0])
    if min(cfg["prompt_tokens"] or [1]) <= 0:
        raise BenchcalError("prompt lengths must be positive")
    if longest + 1 > cfg["context"]:
        raise BenchcalError(f"a {longest}-token prompt does not fit a context of {cfg['context']} tokens")
    decode_context = min(cfg["prompt_tokens"] or [16])
    if decode_context + cfg["gen_tokens"] > cfg["context"]:
        raise BenchcalError(f"{decode_context} prompt + {cfg['gen_tokens']} generated tokens exceed the "
                            f"context of {cfg['context']}")
    if cfg["engine"] == "llama.cpp":
        _llama_defaults(cfg)
    elif cfg["engine"] == "vllm":
        _vllm_defaults(cfg)
    return cfg


def _gguf_path(cfg: Mapping[str, Any]) -> Path | None:
    weights = str(cfg.get("weights") or "synthetic")
    path = Path(weights).expanduser()
    return path if weights not in ("synthetic", "hub") and path.suffix.lower() == ".gguf" else None


def _llama_defaults(cfg: dict[str, Any]) -> None:
    """llama.cpp options: GPU layers in step with ``offload_fraction``, the GGUF's own quant, threads."""
    options = cfg["engine_options"]
    gguf = _gguf_path(cfg)
    if gguf is not None and not cfg.get("quant") and gguf.is_file():
        from predictor.models import resolve_model

        cfg["quant"] = resolve_model(str(gguf)).weights_quant
    if cfg["device"] == "cpu":
        options.setdefault("n_gpu_layers", 0)
    else:
        fraction = float(cfg.get("offload_fraction") or 0.0)
        explicit = options.get("n_gpu_layers")
        if explicit is None and fraction > 0:
            options["n_gpu_layers"] = int(round((1.0 - fraction) * model_arch(cfg).num_layers))
        elif explicit is None:
            options["n_gpu_layers"] = -1
        elif int(explicit) >= 0 and fraction == 0:
            layers = model_arch(cfg).num_layers
            cfg["offload_fraction"] = round(1.0 - min(int(explicit), layers) / layers, 4)
    options.setdefault("flash_attn", False)
    options.setdefault("n_batch", 512)
    options.setdefault("n_ubatch", 512)
    if cfg["device"] == "cpu":
        options.setdefault("threads", default_threads())


def _vllm_defaults(cfg: dict[str, Any]) -> None:
    """vLLM options (KV pool, graphs, memory utilization) and the KV dtype the cache will really hold.

    vLLM's ``kv_cache_dtype="auto"`` stores the cache in the model's dtype, so an f16/bf16/auto request is
    recorded as that dtype (bf16 for a BF16 model); fp8 kinds are kept as asked.
    """
    from harness.engines.vllm_options import QUANT_SETTINGS, default_engine_options, kv_cache_dtype

    cfg["engine_options"] = default_engine_options(cfg)
    kv_pool = cfg["engine_options"]["kv_pool"]
    if kv_pool not in ("pinned", "profiled"):
        raise BenchcalError(f"engine option kv_pool must be 'pinned' or 'profiled', got {kv_pool!r}")
    quant = str(cfg.get("quant") or "auto").lower()
    if str(cfg.get("weights") or "synthetic") == "synthetic" and quant not in QUANT_SETTINGS:
        raise BenchcalError(f"quant {cfg['quant']!r} cannot be made synthetic for vLLM "
                            f"(supported: {', '.join(sorted(QUANT_SETTINGS))})")
    if kv_cache_dtype(cfg.get("kv_dtype")) == "auto":
        cfg["kv_dtype"] = _vllm_model_dtype(cfg) or str(cfg.get("kv_dtype") or "auto").lower()


# quant or vLLM dtype -> the dtype it names (other quants run in the checkpoint's torch_dtype).
_VLLM_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
                "f32": "f32", "fp32": "f32", "float32": "f32"}


def _vllm_model_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The model dtype vLLM will run in: engine option ``dtype``, the quant, else the config's torch_dtype."""
    for name in ((cfg.get("engine_options") or {}).get("dtype"), cfg.get("quant")):
        if name and str(name).lower() in _VLLM_DTYPES:
            return _VLLM_DTYPES[str(name).lower()]
    hf_config = _vllm_hf_config(cfg) or {}
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else {}
    for source in (hf_config, text):
        name = source.get("torch_dtype") or source.get("dtype")
        if isinstance(name, str) and name.lower() in _VLLM_DTYPES:
            return _VLLM_DTYPES[name.lower()]
    return None


def _vllm_hf_config(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The HF config vLLM will load: a directory's config.json, the synthetic model's config, else None."""
    import json

    weights = str(cfg.get("weights") or "synthetic")
    if weights == "synthetic":
        from harness.synthetic_hf import base_config

        try:
            return base_config(str(cfg["model"]))
        except BenchcalError:
            return None  # prepare_weights says why
    path = Path(weights).expanduser() / "config.json"
    if weights != "hub" and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def _vllm_synthetic_overrides(cfg: Mapping[str, Any]) -> dict[str, int] | None:
    """Shrink overrides of a synthetic vLLM model: ``arch_overrides``, else engine option synthetic_overrides."""
    for value in (cfg.get("arch_overrides"), (cfg.get("engine_options") or {}).get("synthetic_overrides")):
        if isinstance(value, Mapping) and value:
            return {str(k): int(v) for k, v in value.items()}
    return None


def default_threads() -> int:
    """CPU threads for llama.cpp: the physical cores, leaving one hardware thread to the harness's sampler.

    With SMT the sibling threads are free already; without it one core is left out (ggml's spinning thread
    barrier slows down many times over when any of its threads is preempted).
    """
    import psutil

    from harness.hostinfo import usable_cores

    logical = usable_cores()
    physical = int(psutil.cpu_count(logical=False) or logical)
    physical = min(physical, logical)
    return physical if logical > physical else max(1, physical - 1)


def model_arch(cfg: Mapping[str, Any]) -> Any:
    """The architecture a config measures: its GGUF's, else the catalogue model's with its overrides (a synthetic
    GGUF sized as llama-quantize lays out its tensors)."""
    from harness import synthetic

    gguf = _gguf_path(cfg)
    if gguf is not None and gguf.is_file():
        from predictor.models import resolve_model

        return resolve_model(str(gguf))
    arch = synthetic.resolve_arch(cfg["model"], cfg.get("arch_overrides"))
    quant = cfg.get("quant")
    if cfg.get("weights") == "synthetic" and cfg["engine"] == "llama.cpp" and quant in synthetic.FILE_TYPES:
        # the synthetic GGUF's tensor types follow llama-quantize (output or tied embeddings in Q6_K, ...):
        # predict with its exact size, as for any GGUF file, not the catalogue's whole-file average width
        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        arch = dataclasses.replace(arch, weights_bytes_exact=synthetic.weights_bytes(spec, quant), weights_quant=quant)
    return arch


# ----------------------------------------------------------------------------------------------- weights


def prepare_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Path of the weights to load and facts about them (for provenance)."""
    weights = str(cfg.get("weights") or "synthetic")
    if weights == "synthetic":
        if cfg["engine"] == "vllm":
            return _vllm_synthetic_weights(cfg)
        if cfg["engine"] != "llama.cpp":
            return None, {"weights_kind": "synthetic"}
        from harness import synthetic

        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        quant = synthetic.normalize_file_type(cfg.get("quant") or "Q4_K_M")
        path = synthetic.synthetic_gguf(cfg["model"], quant, cfg.get("arch_overrides"))
        return str(path), {"weights_kind": "synthetic", "weights_file": str(path),
                           "weights_bytes": synthetic.weights_bytes(spec, quant),
                           "synthetic_layout": spec["gguf_arch"], "synthetic_exact_layout": spec["exact_layout"]}
    if weights == "hub":
        return _hub_weights(cfg)
    path = Path(weights).expanduser()
    if not path.exists():
        raise BenchcalError(f"weights file {weights} does not exist")
    return str(path), {"weights_kind": "path", "weights_file": str(path), "weights_bytes": _size(path)}


def _vllm_synthetic_weights(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cached config-only HF directory vLLM loads with random weights (``load_format="dummy"``)."""
    import json

    from harness.synthetic_hf import synthetic_hf_dir

    folder = synthetic_hf_dir(str(cfg["model"]), _vllm_synthetic_overrides(cfg))
    hf_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return str(folder), {"weights_kind": "synthetic", "weights_file": str(folder), "weights_load_format": "dummy",
                         "synthetic_layout": (hf_config.get("architectures") or [None])[0]}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hub_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Download the model's weights from the Hugging Face hub (GGUF for llama.cpp)."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise BenchcalError("--weights hub needs huggingface_hub (pip install huggingface_hub)") from exc
    from predictor.models import resolve_model

    arch = resolve_model(cfg["model"])
    repo = cfg.get("engine_options", {}).get("hub_repo") or arch.hf_id
    if not repo:
        raise BenchcalError(f"{cfg['model']} has no Hugging Face id; pass --weights PATH")
    try:
        if cfg["engine"] == "llama.cpp":
            filename = cfg.get("engine_options", {}).get("hub_file")
            if not filename:
                raise BenchcalError("--weights hub with llama.cpp needs engine option hub_repo and hub_file "
                                    "(a GGUF repository and file name)")
            path = huggingface_hub.hf_hub_download(repo, filename)
        else:
            path = huggingface_hub.snapshot_download(repo)
    except BenchcalError:
        raise
    except Exception as exc:
        raise BenchcalError(f"could not download {repo} from the hub ({type(exc).__name__}); "
                            "no network? pass --weights PATH") from exc
    return path, {"weights_kind": "hub", "weights_file": path, "hub_repo": repo}


# ------------------------------------------------------------------------------------------------- log

def log_path_for(cfg: Mapping[str, Any]) -> Path:
    """Where the child's log goes: ``$BENCHCAL_CACHE/logs/<time>-<hash10>.log``."""
    from harness.synthetic import cache_dir

    stamp = records.new_record_id(records.config_hash(cfg))
    return cache_dir() / "logs" / f"{stamp}.log"
