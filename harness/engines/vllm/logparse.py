"""Parsers of vLLM's log: its memory figures and its out-of-memory messages.

Memory figures vLLM prints (read from vLLM's source; the installed 0.32.0 and older releases):

- V1 GPU worker: ``Model loading took X GiB memory and T seconds``; ``Available KV cache memory: X GiB``;
  ``GPU KV cache size: N tokens``; the INFO summary ``Free memory on device (free/total GiB) on startup.
  Desired GPU memory utilization is (u, R GiB). Actual usage is A GiB for consumed memory (weights +
  non-torch), B GiB for peak activation, and C GiB for CUDAGraph memory. ... Current kv cache memory in use
  is K GiB.`` (only when the KV pool is profiled, not pinned); at DEBUG the profiling result ``Total non KV
  cache memory: ...; torch peak memory increase: ...; total consumed (from mem_get_info): ...; weights
  memory: ...``; with ``kv_cache_memory_bytes``: ``reserved X GiB memory for KV Cache as specified by
  kv_cache_memory_bytes config and skipped memory profiling``.
- V1 CPU worker: ``Auto set (kv/node total) GiB for KV cache on node N, with R GiB requested memory for the
  worker. C GiB memory was consumed by non-kv usages.`` or ``Explicitly set (kv/node total) GiB for KV cache
  on node N.``; ``CPU KV cache size: N tokens``. The CPU build repacks linear weights for oneDNN, so it
  prints no weights figure; the child logs an inventory of the model's modules instead (``benchcal-vllm
  inventory: ...``).
- V0 (<= 0.8): ``Loading model weights took X GB`` (GB meaning 2**30 bytes) / ``Model loading took X GB
  and T seconds``; ``model weights take X GiB; non_torch_memory takes X GiB; PyTorch activation peak memory
  takes X GiB; the rest of the memory reserved for KV Cache is X GiB.``; ``the current vLLM instance can use
  total_gpu_memory (T GiB) x gpu_memory_utilization (u) = R GiB``; ``# GPU blocks: N, # CPU blocks: M``.

vLLM rounds every GiB figure to 2 decimals (``format_gib``): parsed bytes are good to about 5 MiB.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harness.engines.vllm.options import INVENTORY_PREFIX, OPTIONS_PREFIX

GIB = 2**30
MIB = 2**20
LOG_ROUNDING_BYTES = int(0.0051 * GIB)  # vLLM prints GiB with 2 decimals

# vLLM messages that mean the model, its KV cache or its working memory did not fit (case-insensitive).
VLLM_OOM_PATTERNS: tuple[str, ...] = (
    r"To serve at least one request with the models?'s? max seq len",
    r"is larger than the maximum number of tokens that can be stored in KV cache",
    r"No available memory for the cache blocks",
    r"is less than requested memory for kv",
    r"is less than desired (?:GPU|CPU) memory utilization",
    r"OutOfMemoryError",
)

_NUM = r"(-?\d[\d,]*(?:\.\d+)?)"


def _gib(text: str) -> int:
    return int(round(float(text.replace(",", "")) * GIB))


def _count(text: str) -> int:
    return int(text.replace(",", ""))


def _weights_with_unit(value: str, unit: str) -> int:
    """Bytes of ``Model loading took <value> <unit>``: GB/GiB are 2**30 bytes, MB/MiB 2**20 in vLLM."""
    scale = GIB if unit.upper().startswith("G") else MIB
    return int(round(float(value.replace(",", "")) * scale))


# (key, regex, converter per group). Later lines overwrite earlier ones: the last figure printed wins.
_RULES: tuple[tuple[tuple[str, ...], re.Pattern[str], Any], ...] = (
    (("weights_bytes",), re.compile(rf"(?:Model loading took|Loading model weights took)\s+{_NUM}\s*(GiB|GB|MiB|MB)"),
     lambda m: (_weights_with_unit(m.group(1), m.group(2)),)),
    (("weights_bytes",), re.compile(rf"model weights take\s*{_NUM}\s*GiB"), lambda m: (_gib(m.group(1)),)),
    (("non_torch_bytes",), re.compile(rf"non_torch_memory(?:\s+takes)?\s*=?\s*{_NUM}\s*GiB"),
     lambda m: (_gib(m.group(1)),)),
    (("activation_bytes",), re.compile(rf"PyTorch activation peak memory(?:\s+takes)?\s*{_NUM}\s*GiB"),
     lambda m: (_gib(m.group(1)),)),
    (("kv_bytes",), re.compile(
        rf"(?:the rest of the memory reserved for KV Cache is|available_kv_cache_memory|kv_cache_size=)\s*{_NUM}\s*GiB"),
     lambda m: (_gib(m.group(1)),)),
    (("torch_peak_bytes",), re.compile(rf"peak_torch_memory={_NUM}GiB"), lambda m: (_gib(m.group(1)),)),
    (("device_total_bytes",), re.compile(rf"total_gpu_memory(?:=|\s*\(|\s+){_NUM}\s*GiB"),
     lambda m: (_gib(m.group(1)),)),
    (("device_total_bytes", "gpu_memory_utilization", "requested_bytes"),
     re.compile(rf"total_gpu_memory \({_NUM}GiB\) x gpu_memory_utilization \({_NUM}\) = {_NUM}GiB"),
     lambda m: (_gib(m.group(1)), float(m.group(2)), _gib(m.group(3)))),
    (("kv_bytes",), re.compile(rf"Available KV cache memory:\s*{_NUM}\s*GiB"), lambda m: (_gib(m.group(1)),)),
    (("kv_device", "kv_tokens"), re.compile(r"\b([A-Z]+(?: \+ host)?) KV cache size:\s*([\d,]+) tokens"),
     lambda m: (m.group(1), _count(m.group(2)))),
    (("max_concurrency",), re.compile(rf"Maximum concurrency for [\d,]+ tokens per request:\s*{_NUM}x"),
     lambda m: (float(m.group(1)),)),
    (("gpu_blocks",), re.compile(r"# (?:GPU|CUDA|cuda|gpu|NPU|XPU) blocks:\s*(\d+)"), lambda m: (int(m.group(1)),)),
    (("cpu_blocks",), re.compile(r"# CPU blocks:\s*(\d+)"), lambda m: (int(m.group(1)),)),
    (("kv_bytes", "node_total_bytes"),
     re.compile(rf"(?:Auto|Explicitly) set \({_NUM}/{_NUM}\) GiB for KV cache on node \d+"),
     lambda m: (_gib(m.group(1)), _gib(m.group(2)))),
    (("requested_bytes",), re.compile(rf"with {_NUM} GiB requested memory for the worker"),
     lambda m: (_gib(m.group(1)),)),
    (("non_kv_bytes",), re.compile(rf"{_NUM} GiB\s+memory was consumed by non-kv usages"),
     lambda m: (_gib(m.group(1)),)),
    (("free_at_start_bytes", "kv_bytes"),
     re.compile(rf"Initial free memory {_NUM} GiB, reserved {_NUM} GiB memory for KV Cache as specified"),
     lambda m: (_gib(m.group(1)), _gib(m.group(2)))),
    (("free_at_start_bytes", "device_total_bytes"),
     re.compile(rf"Free memory on device(?: \S+)? \({_NUM}/{_NUM} GiB\) on startup\."),
     lambda m: (_gib(m.group(1)), _gib(m.group(2)))),
    (("gpu_memory_utilization", "requested_bytes"),
     re.compile(rf"Desired GPU memory utilization is \({_NUM}, {_NUM} GiB\)"),
     lambda m: (float(m.group(1)), _gib(m.group(2)))),
    (("consumed_bytes", "activation_bytes", "cuda_graph_bytes"),
     re.compile(rf"Actual usage is {_NUM} GiB for consumed memory \(weights \+ non-torch\), {_NUM} GiB for peak "
                rf"activation, and {_NUM} GiB for CUDAGraph memory"),
     lambda m: (_gib(m.group(1)), _gib(m.group(2)), _gib(m.group(3)))),
    (("kv_bytes",), re.compile(rf"Current kv cache memory in use is {_NUM} GiB"), lambda m: (_gib(m.group(1)),)),
    (("cuda_graph_bytes",), re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} GiB"),
     lambda m: (_gib(m.group(2)),)),
    (("cuda_graph_bytes",), re.compile(rf"CUDA graph pool memory: {_NUM} GiB \(actual\)"),
     lambda m: (_gib(m.group(1)),)),
    (("cuda_graph_estimate_bytes",), re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB total"),
     lambda m: (_gib(m.group(1)),)),
    (("non_kv_bytes", "activation_bytes", "consumed_bytes", "weights_bytes"),
     re.compile(rf"Total non KV cache memory: {_NUM}GiB; torch peak memory increase: {_NUM}GiB; total consumed "
                rf"\(from mem_get_info\): {_NUM}GiB; weights memory: {_NUM}GiB"),
     lambda m: tuple(_gib(m.group(i)) for i in range(1, 5))),
)

# Written by harness.engines.vllm.child after load: figures read from the model's modules in the worker.
_INVENTORY = re.compile(re.escape(INVENTORY_PREFIX) + r" weights_bytes=(\d+) kv_cache_tensor_bytes=(\d+)")
# Written by harness.engines.vllm.child before building the LLM: the arguments it was given (JSON).
_OPTIONS = re.compile(re.escape(OPTIONS_PREFIX) + r" (\{.*\})\s*$")


def parse_memory_breakdown(log_text: str) -> dict[str, Any]:
    """vLLM's memory figures from its log, in bytes, with the same keys as the llama.cpp parser.

    Keys: ``weights_bytes``, ``kv_bytes``, ``activation_bytes``, ``non_torch_bytes``, ``cuda_graph_bytes``,
    ``compute_bytes`` (activation + non-torch + CUDA graphs, those known), ``total_bytes`` (weights + KV +
    compute, when weights and KV are known), ``kv_tokens``, and ``raw_lines`` (the lines used). Also, where
    printed: ``requested_bytes`` (utilization x total), ``device_total_bytes``, ``node_total_bytes`` (CPU),
    ``non_kv_bytes``, ``consumed_bytes``, ``gpu_blocks``, ``cpu_blocks``, ``max_concurrency``,
    ``kv_device``, ``sources`` (key -> "log" or "inventory"), ``vllm_options`` (the LLM arguments the child
    logged: how the KV pool was sized, ``kv_pool`` pinned or profiled, ``enforce_eager``, ...). Empty dict
    when no memory figure is found.
    """
    found: dict[str, Any] = {}
    lines: list[str] = []
    inventory: dict[str, int] = {}
    for line in log_text.splitlines():
        hit = False
        for keys, pattern, convert in _RULES:
            match = pattern.search(line)
            if match:
                found.update(zip(keys, convert(match), strict=True))
                hit = True
        match = _INVENTORY.search(line)
        if match:
            inventory = {"weights_bytes": int(match.group(1)), "kv_bytes": int(match.group(2))}
            hit = True
        match = _OPTIONS.search(line)
        if match:
            try:
                options = json.loads(match.group(1))
            except json.JSONDecodeError:
                options = None
            if isinstance(options, dict):
                found["vllm_options"] = {**found.get("vllm_options", {}), **options}
        if hit:
            lines.append(line.strip())
    if not (set(found) - {"vllm_options"}) and not inventory:
        return {}
    sources = {key: "log" for key in found if key.endswith("_bytes")}
    for key, value in inventory.items():
        logged = found.get(key)
        if value > 0 and (logged is None or abs(logged - value) <= LOG_ROUNDING_BYTES):
            # Missing from the log, or the log's 2-decimal GiB figure agrees: keep the exact bytes.
            found[key] = value
            sources[key] = "inventory" if logged is None else "inventory (log agrees within 0.01 GiB)"
    return _derive(found, lines, sources)


def _derive(found: dict[str, Any], lines: list[str], sources: dict[str, str]) -> dict[str, Any]:
    """Fill the derived keys: non-torch from consumed - weights, activation from torch peak, sums."""
    out: dict[str, Any] = {key: None for key in (
        "weights_bytes", "kv_bytes", "activation_bytes", "non_torch_bytes", "cuda_graph_bytes",
        "compute_bytes", "total_bytes", "kv_tokens")}
    out.update(found)
    weights = out["weights_bytes"]
    if out["non_torch_bytes"] is None and out.get("consumed_bytes") is not None and weights is not None:
        out["non_torch_bytes"] = max(out["consumed_bytes"] - weights, 0)
        sources["non_torch_bytes"] = "log:consumed-weights"
    if out["activation_bytes"] is None and out.get("torch_peak_bytes") is not None and weights is not None:
        out["activation_bytes"] = max(out["torch_peak_bytes"] - weights, 0)
        sources["activation_bytes"] = "log:torch_peak-weights"
    parts = [out[k] for k in ("activation_bytes", "non_torch_bytes", "cuda_graph_bytes") if out[k] is not None]
    out["compute_bytes"] = sum(parts) if parts else None
    if weights is not None and out["kv_bytes"] is not None:
        out["total_bytes"] = weights + out["kv_bytes"] + (out["compute_bytes"] or 0)
    out["sources"] = sources
    out["raw_lines"] = lines
    return out


# ------------------------------------------------------------------------------------------- engine
