"""vLLM's engine options and the harness's defaults for them: engine-free, imported by the parent
(:mod:`harness.engines.vllm`, :mod:`harness.protocol`) and by the child (:mod:`harness.engines.vllm.child`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

INVENTORY_PREFIX = "benchcal-vllm inventory:"  # the child's log line of its modules' weight and KV bytes
OPTIONS_PREFIX = "benchcal-vllm options:"  # the child's log line of the options it built the LLM with

# quant (record) -> (vLLM dtype, vLLM quantization) for weights vLLM can produce from a config alone.
QUANT_SETTINGS: dict[str, tuple[str, str | None]] = {
    "auto": ("auto", None),
    "bf16": ("bfloat16", None),
    "f16": ("float16", None),
    "fp16": ("float16", None),
    "f32": ("float32", None),
    "fp8": ("auto", "fp8"),
}


CPU_MEMORY_UTILIZATION = 0.3  # fraction of host memory vLLM's CPU backend reserves when KV is profiled
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default


def default_engine_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config's vLLM engine options with the harness's defaults filled in (call before hashing).

    ``kv_pool``: "pinned" (``kv_cache_memory_bytes`` set to the need of ``batch`` sequences of ``context``
    tokens, so memory measured is memory needed) or "profiled" (vLLM sizes the pool from
    ``gpu_memory_utilization``; on CPU a fraction of host memory). ``enforce_eager``: True on CPU (no
    graphs there), False on GPUs (CUDA graphs, vLLM's default).
    """
    options = dict(config.get("engine_options") or {})
    on_cpu = str(config.get("device", "cpu")) == "cpu"
    options.setdefault("kv_pool", "pinned")
    options.setdefault("enforce_eager", on_cpu)
    options.setdefault("gpu_memory_utilization", CPU_MEMORY_UTILIZATION if on_cpu else GPU_MEMORY_UTILIZATION)
    return options



def kv_cache_dtype(kv_dtype: str | None) -> str:
    """vLLM's ``kv_cache_dtype`` for the record's ``kv_dtype``: f16/bf16/auto -> "auto", fp8 kinds kept."""
    name = (kv_dtype or "auto").lower()
    if name in ("f16", "fp16", "float16", "bf16", "bfloat16", "auto"):
        return "auto"
    if name.startswith("fp8"):
        return name
    from predictor.errors import BenchcalError

    raise BenchcalError(f"kv dtype {kv_dtype!r} is not supported by vLLM (supported: f16, bf16, fp8)")


def kv_bytes_per_element(kv_dtype: str | None, model_dtype_bytes: int = 2) -> int:
    """Bytes per cached K or V element: 1 for fp8, else the model dtype's size (2 for f16/bf16)."""
    return 1 if kv_cache_dtype(kv_dtype).startswith("fp8") else model_dtype_bytes


def round_up_tokens(tokens: int, block_tokens: int) -> int:
    """``tokens`` rounded up to whole blocks of ``block_tokens``."""
    return int(math.ceil(tokens / block_tokens) * block_tokens)


def pinned_kv_cache_bytes(kv_need_bytes: int, margin_fraction: float = 0.05) -> int:
    """KV pool to pin (bytes): the need plus a margin for vLLM's per-group padding of hybrid models.

    ``kv_need_bytes`` is what ``batch`` sequences of the context, rounded up to whole blocks, hold.
    """
    return int(math.ceil(kv_need_bytes * (1.0 + margin_fraction)))


def hf_text_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of an HF config (``text_config`` of multimodal configs, else the config)."""
    text = hf_config.get("text_config")
    return text if isinstance(text, Mapping) else hf_config


def special_token_ids(hf_config: Mapping[str, Any]) -> set[int]:
    """BOS/EOS/PAD ids named in an HF config (ints or lists of ints)."""
    ids: set[int] = set()
    for source in (hf_config, hf_text_config(hf_config)):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = source.get(key)
            values = value if isinstance(value, list) else [value]
            ids.update(int(v) for v in values if isinstance(v, int))
    return ids




def vllm_environment(options: Mapping[str, Any], on_cpu: bool, base: Mapping[str, str],
                     pickled_rpc: bool = False) -> dict[str, str]:
    """``base`` with what vLLM reads at import: the logging level, no telemetry, the hub offline, the CPU threads it
    binds, the GPU it sees (values already in ``base`` win, but for the logging level). ``pickled_rpc``: the
    offline engine sends a function to its worker by pickle, which vLLM refuses unless
    ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is set; a server never needs it."""
    env = dict(base)
    env["VLLM_LOGGING_LEVEL"] = str(options.get("log_level", "INFO")).upper()
    defaults = {"VLLM_CONFIGURE_LOGGING": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if options.get("threads"):
        defaults["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{int(options['threads']) - 1}"
    if options.get("gpu_index") is not None and not on_cpu:
        defaults["CUDA_VISIBLE_DEVICES"] = str(options["gpu_index"])
    for key, value in defaults.items():
        env.setdefault(key, value)
    if pickled_rpc:
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    return env
