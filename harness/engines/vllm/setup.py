"""vLLM's parent side: its engine options with the harness's defaults, the KV dtype the cache will really hold,
and the config-only model directory it loads with random weights."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.engines.setup import EngineSetup, ServerSetup
from harness.engines.vllm.options import QUANT_SETTINGS, default_engine_options, kv_cache_dtype
from predictor.errors import BenchcalError

# quant or vLLM dtype -> the dtype it names (other quants run in the checkpoint's torch_dtype).
_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
           "f32": "f32", "fp32": "f32", "float32": "f32"}


class VllmSetup(EngineSetup):
    name = "vllm"
    option_keys = frozenset({"api", "kv_pool", "enforce_eager", "gpu_memory_utilization", "kv_cache_memory_bytes",
                             "dtype", "quantization", "load_format", "log_level", "synthetic_overrides",
                             "trust_remote_code", "max_num_batched_tokens", "block_size"})

    def fill_defaults(self, cfg: dict[str, Any]) -> None:
        """vLLM options (KV pool, graphs, memory utilization) and the KV dtype the cache will really hold.

        vLLM's ``kv_cache_dtype="auto"`` stores the cache in the model's dtype, so an f16/bf16/auto request is
        recorded as that dtype (bf16 for a BF16 model); fp8 kinds are kept as asked.
        """
        cfg["engine_options"] = default_engine_options(cfg)
        kv_pool = cfg["engine_options"]["kv_pool"]
        if kv_pool not in ("pinned", "profiled"):
            raise BenchcalError(f"engine option kv_pool must be 'pinned' or 'profiled', got {kv_pool!r}")
        quant = str(cfg.get("quant") or "auto").lower()
        if str(cfg.get("weights") or "synthetic") == "synthetic" and quant not in QUANT_SETTINGS:
            raise BenchcalError(f"quant {cfg['quant']!r} cannot be made synthetic for vLLM "
                                f"(supported: {', '.join(sorted(QUANT_SETTINGS))})")
        if kv_cache_dtype(cfg.get("kv_dtype")) == "auto":
            cfg["kv_dtype"] = model_dtype(cfg) or str(cfg.get("kv_dtype") or "auto").lower()

    def synthetic_weights(self, cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """The cached config-only HF directory vLLM loads with random weights (``load_format="dummy"``)."""
        from harness.synthetic_hf import synthetic_hf_dir

        folder = synthetic_hf_dir(str(cfg["model"]), synthetic_overrides(cfg))
        hf_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return str(folder), {"weights_kind": "synthetic", "weights_file": str(folder), "weights_load_format": "dummy",
                             "synthetic_layout": (hf_config.get("architectures") or [None])[0]}

    def server(self, cfg: Mapping[str, Any] | None = None) -> ServerSetup:
        """Its OpenAI-compatible server (:mod:`harness.engines.vllm.server`)."""
        from harness.engines.vllm.server import SERVER

        return SERVER


def model_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The model dtype vLLM will run in: engine option ``dtype``, the quant, else the config's torch_dtype."""
    for name in ((cfg.get("engine_options") or {}).get("dtype"), cfg.get("quant")):
        if name and str(name).lower() in _DTYPES:
            return _DTYPES[str(name).lower()]
    hf_config = _hf_config(cfg) or {}
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else {}
    for source in (hf_config, text):
        name = source.get("torch_dtype") or source.get("dtype")
        if isinstance(name, str) and name.lower() in _DTYPES:
            return _DTYPES[name.lower()]
    return None


def _hf_config(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The HF config vLLM will load: a directory's config.json, the synthetic model's config, else None."""
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


def synthetic_overrides(cfg: Mapping[str, Any]) -> dict[str, int] | None:
    """Shrink overrides of a synthetic vLLM model: ``arch_overrides``, else engine option synthetic_overrides."""
    for value in (cfg.get("arch_overrides"), (cfg.get("engine_options") or {}).get("synthetic_overrides")):
        if isinstance(value, Mapping) and value:
            return {str(k): int(v) for k, v in value.items()}
    return None


SETUP = VllmSetup()
