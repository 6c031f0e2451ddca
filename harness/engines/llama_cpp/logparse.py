"""Parsers of llama.cpp's log: its memory lines, its out-of-memory messages and the backend it ran on.

Memory lines (llama.cpp logs, printed to stderr when ``verbose=True``) are matched on their suffix because
the function-name prefix changes between versions: ``<buf> model buffer size = X MiB`` (older:
``llm_load_tensors: <buf> buffer size = X MiB``), ``<buf> KV buffer size = X MiB`` (older total:
``KV self size = X MiB``), ``<buf> compute buffer size = X MiB``, ``<buf> output buffer size = X MiB`` and
``offloaded N/M layers to GPU``. Sources: llama.cpp ``src/llama-model.cpp`` (``load_tensors``),
``src/llama-kv-cache.cpp``, ``src/llama-context.cpp``.
"""

from __future__ import annotations

import re
from typing import Any

MIB = 2**20

# llama.cpp's out-of-memory messages (src/llama-kv-cache.cpp, src/llama-context.cpp, src/llama-model.cpp,
# ggml/src/ggml-backend.cpp, ggml/src/ggml-alloc.c, ggml/src/ggml-cuda/ggml-cuda.cu).
LLAMA_OOM_PATTERNS = (
    r"cudaMalloc failed: out of memory",
    r"failed to allocate (?:\S+ )?buffer of size",
    r"unable to allocate \S+ buffer",
    r"failed to allocate buffer for (?:kv|rs) cache",
    r"failed to allocate compute (?:pp |tg )?buffers",
    r"failed to allocate output buffer",
    r"ggml\S*: .*out of memory",
)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_BUFFER_LINE = re.compile(
    r"(?P<buf>[A-Za-z][\w\[\]:.-]*)\s+(?P<kind>model |KV |compute |output |RS )?buffer size\s*=\s*"
    + _NUMBER + r"\s*(?P<unit>MiB|MB|GiB|KiB)"
)
_KV_SELF = re.compile(r"KV self size\s*=\s*" + _NUMBER + r"\s*(MiB|MB|GiB)", re.IGNORECASE)
_OLD_MEM_REQUIRED = re.compile(r"mem required\s*=\s*" + _NUMBER + r"\s*(MiB|MB)")
_OLD_COMPUTE_TOTAL = re.compile(r"compute buffer total size\s*=\s*" + _NUMBER + r"\s*(MiB|MB)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_MODEL_SECTION = re.compile(r"^\s*(?:llm_)?load_tensors:")
_UNIT_BYTES = {"KiB": 2**10, "MiB": MIB, "MB": MIB, "GiB": 2**30}  # llama.cpp's "MB" was bytes / 1024 / 1024
_DEVICE_BUFFER = re.compile(r"^(?:CUDA|ROCm|HIP|Vulkan|Metal|MTL|SYCL|MUSA|CANN|OpenCL)\d*$", re.IGNORECASE)


def _to_bytes(value: str, unit: str) -> int:
    return int(round(float(value) * _UNIT_BYTES[unit]))


def parse_memory_lines(log_text: str) -> dict[str, Any]:
    """Memory figures (bytes) from llama.cpp's log: weights, KV, compute and output buffers per buffer type.

    When a buffer is reported more than once (a context created again), the last report counts.
    ``device_bytes`` sums buffers on accelerators (``CUDA0``...), ``host_bytes`` the rest (``CPU``,
    ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA_Host``...). Keys are None when the log has no such line.
    """
    buffers: dict[str, dict[str, int]] = {"model": {}, "kv": {}, "compute": {}, "output": {}}
    raw_lines: list[str] = []
    kv_self_bytes = old_model_bytes = old_compute_bytes = None
    offloaded = total_layers = None
    for line in log_text.splitlines():
        match = _BUFFER_LINE.search(line)
        if match:
            kind = (match.group("kind") or "").strip()
            category = {"model": "model", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}.get(kind)
            if category is None and _MODEL_SECTION.match(line):
                category = "model"  # older llama.cpp: "llm_load_tensors:  CUDA0 buffer size = X MiB"
            if category is not None:
                buffers[category][match.group("buf")] = _to_bytes(match.group(3), match.group("unit"))
                raw_lines.append(line.strip())
            continue
        for pattern, slot in ((_KV_SELF, "kv"), (_OLD_MEM_REQUIRED, "model"), (_OLD_COMPUTE_TOTAL, "compute")):
            found = pattern.search(line)
            if found:
                value = _to_bytes(found.group(1), found.group(2))
                if slot == "kv":
                    kv_self_bytes = value
                elif slot == "model":
                    old_model_bytes = value
                else:
                    old_compute_bytes = value
                raw_lines.append(line.strip())
        found = _OFFLOADED.search(line)
        if found:
            offloaded, total_layers = int(found.group(1)), int(found.group(2))
            raw_lines.append(line.strip())
    return _summarize_buffers(buffers, kv_self_bytes, old_model_bytes, old_compute_bytes,
                              offloaded, total_layers, raw_lines)


def _summarize_buffers(
    buffers: dict[str, dict[str, int]],
    kv_self_bytes: int | None,
    old_model_bytes: int | None,
    old_compute_bytes: int | None,
    offloaded: int | None,
    total_layers: int | None,
    raw_lines: list[str],
) -> dict[str, Any]:
    def total(category: str, fallback: int | None) -> int | None:
        return sum(buffers[category].values()) if buffers[category] else fallback

    weights = total("model", old_model_bytes)
    kv = total("kv", kv_self_bytes)
    compute = total("compute", old_compute_bytes)
    output = total("output", None)
    parts = [p for p in (weights, kv, compute, output) if p is not None]
    device_bytes = sum(v for cat in buffers.values() for name, v in cat.items() if _DEVICE_BUFFER.match(name))
    host_bytes = sum(v for cat in buffers.values() for name, v in cat.items() if not _DEVICE_BUFFER.match(name))
    return {
        "weights_bytes": weights,
        "kv_bytes": kv,
        "compute_bytes": compute,
        "output_bytes": output,
        "total_bytes": sum(parts) if parts else None,
        "device_bytes": device_bytes if any(buffers.values()) else None,
        "host_bytes": host_bytes if any(buffers.values()) else None,
        "offloaded_layers": offloaded,
        "total_layers": total_layers,
        "buffers": {k: dict(v) for k, v in buffers.items() if v},
        "raw_lines": raw_lines,
    }


# How each GPU backend announces itself (ggml/src/ggml-cuda/ggml-cuda.cu: "ggml_cuda_init: found N CUDA devices",
# "ROCm devices" in a HIP build; ggml-metal: "ggml_metal_init"; ggml-vulkan: "ggml_vulkan: Found N Vulkan devices";
# ggml-sycl: "ggml_sycl_init"), and the buffers named after them ("CUDA0 KV buffer size", "MTL0_Mapped model buffer").
_BACKEND_MARKERS = (
    ("ROCm", re.compile(r"ggml_cuda_init: found \d+ ROCm devices|\bROCm\d+ (?:model |KV |compute )?buffer")),
    ("CUDA", re.compile(r"ggml_cuda_init: found \d+ CUDA devices|\bCUDA\d+ (?:model |KV |compute )?buffer")),
    ("Metal", re.compile(r"ggml_metal_init|\bMTL\d*(?:_Mapped)? (?:model |KV |compute )?buffer|\bMetal (?:model |KV )?buffer")),
    ("Vulkan", re.compile(r"ggml_vulkan: Found|\bVulkan\d+ (?:model |KV |compute )?buffer")),
    ("SYCL", re.compile(r"ggml_sycl_init|\bSYCL\d+ (?:model |KV |compute )?buffer")),
)
_CPU_ONLY = re.compile(r"system_info:|assigned to device CPU|\bCPU(?:_Mapped|_REPACK)? model buffer size")


def log_backend(log_text: str) -> str | None:
    """The llama.cpp backend a log shows its run on (``predictor.backends`` ids: CUDA, ROCm, Metal, Vulkan, SYCL), CPU
    where it names only the CPU (its system info, layers assigned to the CPU, CPU model buffers), None where it
    says neither."""
    for backend, pattern in _BACKEND_MARKERS:
        if pattern.search(log_text):
            return backend
    return "CPU" if _CPU_ONLY.search(log_text) else None
