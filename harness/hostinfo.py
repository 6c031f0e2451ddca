"""Who the host CPU is: model, instruction-set flags, cores, and the device id its runs are calibrated under.

Two CPUs that report the same model name can run llama.cpp's kernels at very different speeds (a VM's
"AMD EPYC" may be a Zen 3 with AVX2 or a Zen 4 with AVX-512), so a CPU's calibration identity is
``cpu-<model>-<isa>-<cores>c``: the model name, the widest vector extension the kernels can use (AMX,
AVX-512, AVX2, AVX; SVE2, SVE, NEON) and the cores this process may use, e.g. ``cpu-amd-epyc-avx512-2c``.

Flags come from ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on Arm) on Linux; on macOS an Apple
chip is NEON. For records written before the harness stored them, :func:`flags_from_system_info` reads
the same extensions from llama.cpp's ``system_info`` line in the run's log.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# The extensions llama.cpp's CPU kernels select on (ggml-cpu's feature checks), in /proc/cpuinfo spelling.
KERNEL_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi",
    "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "asimdhp", "i8mm", "bf16", "sve",
    "sve2", "sme",
)
# llama.cpp's system_info names -> /proc/cpuinfo names.
_SYSTEM_INFO_FLAGS = {
    "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX_VNNI": "avx_vnni", "AVX512": "avx512f",
    "AVX512_VNNI": "avx512_vnni", "AVX512_VBMI": "avx512vbmi", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8", "AMX_BF16": "amx_bf16", "NEON": "asimd", "ARM_FMA": "asimd", "DOTPROD": "asimddp",
    "FP16_VA": "asimdhp", "MATMUL_INT8": "i8mm", "SVE": "sve", "SVE2": "sve2", "SME": "sme",
}
# Widest first: the first level whose flag is present names the host's ISA class.
ISA_LEVELS = (("amx", "amx_tile"), ("amx", "amx_int8"), ("avx512", "avx512f"), ("avx2", "avx2"), ("avx", "avx"),
              ("sve2", "sve2"), ("sve", "sve"), ("neon", "asimd"))
_MODEL_NOISE = re.compile(r"\((?:r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\b\d+-core\b|\bwith\b.*$", re.IGNORECASE)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_cpuinfo_flags(text: str) -> list[str]:
    """The kernel-relevant flags of the first CPU in a ``/proc/cpuinfo`` text (x86 ``flags``, Arm ``Features``)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            present = set(value.split())
            return [flag for flag in KERNEL_FLAGS if flag in present]
    return []


def cpu_flags() -> list[str]:
    """This host's kernel-relevant instruction-set flags (an Apple chip on macOS: NEON with dot product)."""
    try:
        flags = parse_cpuinfo_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        flags = []
    if not flags and platform.system() == "Darwin" and platform.machine() == "arm64":
        flags = ["asimd", "asimddp", "asimdhp"]
    return flags


def flags_from_system_info(log_text: str) -> list[str] | None:
    """Flags from llama.cpp's system info (``system_info: ... | CPU : AVX = 1 | AVX2 = 1 | ...``, or the
    ``CPU : SSE3 = 1 | ...`` line llama-cpp-python logs on load); None without one."""
    match = re.search(r"(?:system_info:|^CPU : )[^\n]*", log_text or "", re.MULTILINE)
    if not match:
        return None
    found = {name for name, value in re.findall(r"\b([A-Z0-9_]+) = (\d)", match.group(0)) if value == "1"}
    present = {_SYSTEM_INFO_FLAGS[name] for name in found if name in _SYSTEM_INFO_FLAGS}
    if "avx512f" in present:  # llama.cpp prints AVX512 for the foundation; BW/VL come with every AVX-512 core it builds for
        present |= {"avx512bw", "avx512vl"}
    return [flag for flag in KERNEL_FLAGS if flag in present]


def isa_level(flags: Iterable[str]) -> str:
    """The widest vector extension among ``flags``: amx, avx512, avx2, avx, sve2, sve, neon, or ``scalar``."""
    present = set(flags)
    for level, flag in ISA_LEVELS:
        if flag in present:
            return level
    return "scalar"


def model_slug(model: str) -> str:
    """``"Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz"`` -> ``"intel-xeon-platinum-8480"``."""
    text = _MODEL_NOISE.sub(" ", model or "")
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "unknown"


def host_device_id(model: str, flags: Iterable[str], cores: int) -> str:
    """The calibration identity of a CPU: ``cpu-<model>-<isa>-<cores>c``."""
    return f"cpu-{model_slug(model)}-{isa_level(flags)}-{int(cores)}c"


def host_identity() -> dict[str, Any]:
    """``{cpu_model, cpu_flags, isa, cores, host_id}`` of this machine."""
    model, flags, cores = cpu_model(), cpu_flags(), usable_cores()
    return {"cpu_model": model, "cpu_flags": flags, "isa": isa_level(flags), "cores": cores,
            "host_id": host_device_id(model, flags, cores)}


def record_host_id(provenance: Mapping[str, Any]) -> str | None:
    """The host id a CPU run's provenance names (stored, or rebuilt from its model, flags and cores)."""
    if provenance.get("host_id"):
        return str(provenance["host_id"])
    flags, model, cores = provenance.get("cpu_flags"), provenance.get("cpu_model"), provenance.get("cpu_cores")
    if isinstance(flags, list) and model and cores:
        return host_device_id(str(model), flags, int(cores))
    return None
