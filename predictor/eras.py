"""Engine build eras: which era a build belongs to, read from ``predictor/data/engine_eras.json``.

llama.cpp changes its kernels often (CUDA graphs, MMQ, flash-attention kernels, Metal rewrites), so the
coefficients that describe kernels rather than the device (the fixed times per step and per layer, prefill's
matmul efficiency: the file's ``era_terms``) are fitted per era where the runs show a difference
(``calibration.overlays.fit_era_overlays``). Each era is a range of build numbers with the change that marks
its start and how its boundary was placed. A run's build comes from its ``engine_version``
("llama.cpp build 2824 (4426e298)") or, for llama-cpp-python, from the llama.cpp commit it vendors
(``provenance.engine_commit``, looked up in the file's ``vendored`` table).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from predictor.engines import traits
from predictor.errors import BenchcalError

ERAS_PATH = Path(__file__).with_name("data") / "engine_eras.json"
_BUILD = re.compile(r"\bbuild\s+(\d+)\b")
_VERSION = re.compile(r"^\s*(?:vllm\s+)?v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class Era:
    """One era of an engine: builds (llama.cpp) or versions (vLLM) in ``[start, end)``; ``end`` None: open."""

    engine: str
    id: str
    start: tuple[int, ...]
    end: tuple[int, ...] | None
    label: str
    marked_by: str
    boundary_basis: str
    cuda_quantized_prefill: str | None = None  # "cublas-fp16": quantized prefill through an FP16 copy and cuBLAS

    def contains(self, key: tuple[int, ...]) -> bool:
        return self.start <= key and (self.end is None or key < self.end)


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split("."))


@lru_cache(maxsize=1)
def _catalogue() -> dict:
    return json.loads(ERAS_PATH.read_text(encoding="utf-8"))


def _engine_entry(engine: str) -> dict:
    return (_catalogue().get("engines") or {}).get(engine) or {}


def _version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version such as "0.10.1" or "vllm 0.32.0"; None for other text."""
    match = _VERSION.search(str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


@cache
def eras(engine: str) -> tuple[Era, ...]:
    """The eras of ``engine``, oldest first (empty for an engine the file does not list)."""
    out = []
    for item in _engine_entry(engine).get("eras") or []:
        if "from_build" in item:
            start, end = (int(item["from_build"]),), (int(item["until_build"]),) if item.get("until_build") else None
        else:
            start = _version_key(item["from_version"])
            end = _version_key(item["until_version"]) if item.get("until_version") else None
        out.append(Era(engine, str(item["id"]), start, end, str(item.get("label") or ""),
                       str(item.get("marked_by") or ""), str(item.get("boundary_basis") or ""),
                       (item.get("cuda_quantized_prefill") or {}).get("path")))
    return tuple(out)


def no_era_architectures(engine: str) -> frozenset[str]:
    """Device architectures whose runs the build eras do not describe (``no_era_architectures`` in the eras file:
    llama.cpp's CUDA graphs, which set the eras' decode fixed times, never run below Ampere)."""
    return frozenset((_engine_entry(engine).get("no_era_architectures") or {}).get("architectures") or ())


def era_applies(engine: str, device: object) -> bool:
    """False for a catalogue device of an architecture :func:`no_era_architectures` lists; True otherwise."""
    return getattr(device, "architecture", None) not in no_era_architectures(engine)


def cublas_dequant(engine: str, era: str | None, device: object) -> bool:
    """True when ``engine``'s builds of ``era`` multiplied a prompt's quantized weights through an FP16 copy and
    cuBLAS on ``device`` (the era's ``cuda_quantized_prefill`` path, on an NVIDIA GPU: every one the catalogue
    lists has tensor cores): what an imported log of such a build says with ``CUDA_USE_TENSOR_CORES: yes``."""
    found = era_by_id(engine, era) if era else None
    return bool(found is not None and found.cuda_quantized_prefill == "cublas-fp16"
                and getattr(device, "kind", None) == "gpu" and getattr(device, "vendor", None) == "nvidia")


def era_terms(engine: str) -> tuple[str, ...]:
    """The coefficients fitted per era for ``engine`` (none for an engine without eras)."""
    return tuple(_engine_entry(engine).get("era_terms") or ())


def build_number(engine_version: str | None, engine_commit: str | None = None) -> int | None:
    """llama.cpp build number of a run: from "llama.cpp build N (...)", else from the vendored commit."""
    match = _BUILD.search(str(engine_version or ""))
    if match:
        return int(match.group(1))
    commits = (_engine_entry("llama.cpp").get("vendored") or {}).get("commits") or {}
    commit = str(engine_commit or "").strip().lower()
    for known, item in commits.items():
        if commit and (commit.startswith(known) or known.startswith(commit)) and len(commit) >= 7:
            return int(item["build"])
    return None


def era_of_key(engine: str, key: tuple[int, ...] | None) -> Era | None:
    if key is None:
        return None
    return next((era for era in eras(engine) if era.contains(key)), None)


def run_era(engine: str, engine_version: str | None, engine_commit: str | None = None) -> str | None:
    """The era id of a run (None when its build or version is unknown)."""
    if traits(engine).versioned_by == "build":
        build = build_number(engine_version, engine_commit)
        era = era_of_key(engine, (build,) if build is not None else None)
    else:
        era = era_of_key(engine, _version(engine_version))
    return era.id if era else None


def era_for_build(engine: str, build: str | int) -> Era:
    """The era of a build given on the command line (llama.cpp: a build number such as 7474 or b7474; vLLM:
    a version such as 0.10.1). Raises BenchcalError for text that is neither."""
    text = str(build).strip()
    if traits(engine).versioned_by == "build":
        digits = text[1:] if text[:1] in ("b", "B") else text
        if not digits.isdigit():
            raise BenchcalError(f"--engine-build: '{build}' is not a llama.cpp build number (e.g. 7474 or b7474)")
        era = era_of_key(engine, (int(digits),))
    else:
        version = _version(text)
        if version is None:
            raise BenchcalError(f"--engine-build: '{build}' is not a {engine} version (e.g. 0.10.1)")
        era = era_of_key(engine, version)
    if era is None:
        raise BenchcalError(f"--engine-build: no {engine} era covers '{build}' (see predictor/data/engine_eras.json)")
    return era


def kv_pool_counts_cuda_graphs(engine: str, build: str | int | None) -> bool:
    """Whether ``engine`` at ``build`` (a version; None: the newest) takes its CUDA graphs' memory from the KV pool
    it sizes (the eras file's ``kv_pool_counts_cuda_graphs``: vLLM from 0.21); True for a version it cannot read."""
    entry = _engine_entry(engine).get("kv_pool_counts_cuda_graphs")
    if not entry:
        return False
    version = _version(build) if build is not None else None
    return version is None or version >= _version_key(entry["from_version"])


def unpacking_kernel(engine: str, build: str | int | None, quant: str) -> bool:
    """Whether ``engine`` at ``build`` (a version; None: the newest) decodes ``quant`` weights with a kernel that
    unpacks them on the GPU's ALUs (the eras file's ``unpacking_kernels``: vLLM's AWQ GEMM kernel before 0.5.3);
    False for a version it cannot read."""
    entry = _engine_entry(engine).get("unpacking_kernels")
    if not entry or quant not in entry.get("formats", ()) or build is None:
        return False
    found = re.search(r"(\d+(?:\.\d+)+)", str(build))
    return found is not None and _version_key(found.group(1)) < _version_key(entry["until_version"])


def era_by_id(engine: str, era_id: str) -> Era | None:
    return next((era for era in eras(engine) if era.id == era_id), None)


def era_description(engine: str, kind: str, era: str | None, build: str | int | None,
                    cset: Any, overlay: bool = False, device: Any = None) -> dict[str, Any]:
    """Which engine build era a prediction used (``cset``: its CoefficientSet; ``overlay``: the table has era values
    for ``era`` on ``kind`` devices; ``device``: the catalogue device, whose architecture may take no era):
    ``{id, label, build, applied, note}``, and ``quantized_prefill: "cublas-fp16"`` where the era's builds
    multiplied a prompt's quantized weights through cuBLAS on the device (:func:`cublas_dequant`)."""
    found = era_by_id(engine, era) if era else None
    if era and overlay and device is not None and not era_applies(engine, device):
        note = (f"era {era} ({found.label if found else ''}): not applied to a {device.architecture} GPU, "
                "which runs no CUDA graphs in any build (llama.cpp disables them below compute capability 8.0); "
                f"the {cset.scope} scope's values stand")
    elif cset.era:
        terms = sorted(k for k, v in cset.origin.items() if v.startswith("era:"))
        note = f"era {cset.era} ({found.label if found else ''}): {', '.join(terms)} fitted on that era's {kind} runs"
    elif era and overlay:
        note = (f"era {era} ({found.label if found else ''}): the {cset.scope} scope was fitted on that era's runs "
                "alone, so its own values stand for the era")
    elif era:
        note = (f"era {era} ({found.label if found else ''}): no values fitted for this era on {kind} devices "
                "(its runs show no difference, or there are none); coefficients pooled over every build measured")
    elif cset.status == "default":
        note = "none: the uncalibrated engine defaults describe no particular build"
    else:
        note = f"no era fitted for {engine} on {kind} devices; coefficients pooled over every build measured"
    out = {"id": era, "label": found.label if found else None, "build": None if build is None else str(build),
           "applied": bool(cset.era), "note": note}
    if device is not None and cublas_dequant(engine, era, device):
        out["quantized_prefill"] = "cublas-fp16"
        out["note"] = (f"{note}; a prompt's quantized matmuls priced through an FP16 copy of the weights and cuBLAS, "
                       "the era's CUDA path (PR #8075 replaced it with MMQ)")
    return out
