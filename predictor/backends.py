"""llama.cpp's compute backends: which one a device runs by default, how names in logs and llama-bench's
``backend`` column map to one, and the kernel facts of each the formulas read.

Every figure comes from ``predictor/data/backends.json``, with the source file it was read from (``sources``) and
how (``notes``). A scenario names its backend (``Scenario.backend``; ``predict --backend``); None is the default of
the device's vendor (:func:`default_backend`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from predictor.errors import BenchcalError, suggest

BACKENDS_PATH = Path(__file__).with_name("data") / "backends.json"


@dataclass(frozen=True)
class Backend:
    """One llama.cpp backend. ``expert_tile_tokens``: the token columns of the tiles its prefill multiplies a
    quantized expert's routed tokens in (None: not read from its source, priced as the dense matmul; 1: no
    padding); ``expert_tile_tokens_without_mma`` the width on the ``architectures_without_mma``;
    ``fp16_gemm_architectures`` the device architectures whose prompts multiply quantized weights through an FP16
    copy and the BLAS library rather than the backend's quantized kernels."""

    id: str
    aliases: tuple[str, ...]
    default_for_vendors: tuple[str, ...]
    runs_on_vendors: tuple[str, ...]
    expert_tile_tokens: int | None
    expert_tile_tokens_without_mma: int | None = None
    architectures_without_mma: tuple[str, ...] = ()
    fp16_gemm_architectures: tuple[str, ...] = ()

    def quantized_prefill_through_fp16(self, architecture: str | None) -> bool:
        """Whether a prompt's quantized weights are dequantized to an FP16 copy and multiplied by the vendor's BLAS
        on a device of ``architecture`` in every build (``fp16_gemm_architectures``: CUDA on Volta)."""
        return architecture in self.fp16_gemm_architectures

    def expert_tile(self, architecture: str | None) -> int | None:
        """The expert tile width on a device of ``architecture``."""
        if self.expert_tile_tokens_without_mma and architecture in self.architectures_without_mma:
            return self.expert_tile_tokens_without_mma
        return self.expert_tile_tokens


@lru_cache(maxsize=1)
def load_backends() -> tuple[Backend, ...]:
    data = json.loads(BACKENDS_PATH.read_text(encoding="utf-8"))
    return tuple(Backend(id=b["id"], aliases=tuple(b.get("aliases") or ()),
                         default_for_vendors=tuple(b.get("default_for_vendors") or ()),
                         runs_on_vendors=tuple(b.get("runs_on_vendors") or ()),
                         expert_tile_tokens=b.get("expert_tile_tokens"),
                         expert_tile_tokens_without_mma=b.get("expert_tile_tokens_without_mma"),
                         architectures_without_mma=tuple(b.get("architectures_without_mma") or ()),
                         fp16_gemm_architectures=tuple(b.get("fp16_gemm_architectures") or ()))
                 for b in data["backends"])


def backend_ids() -> list[str]:
    return [b.id for b in load_backends()]


@lru_cache(maxsize=1)
def _by_name() -> dict[str, Backend]:
    index: dict[str, Backend] = {}
    for b in load_backends():
        for name in (b.id, *b.aliases):
            index[name.lower()] = b
    return index


def find_backend(name: str | None) -> Backend | None:
    """The backend a name stands for (llama-bench's ``backend`` column, "CUDA" or "Metal,BLAS"; a build's kind,
    "cuda"), None where the name is empty or unknown. A list names its GPU backend first where it has one
    ("BLAS,Metal" is Metal; "CUDA,BLAS" CUDA)."""
    if not name:
        return None
    text = str(name).strip()
    found = _by_name().get(text.lower())
    if found is not None:
        return found
    parts = [_by_name().get(p.strip().lower()) for p in text.replace("+", ",").split(",")]
    known = [p for p in parts if p is not None]
    gpu = [p for p in known if p.id != "CPU"]
    return (gpu or known or [None])[0]


def resolve_backend(name: str) -> Backend:
    """The backend ``name`` names; BenchcalError (one line, with a suggestion) for an unknown one."""
    found = find_backend(name)
    if found is None:
        raise BenchcalError(f"unknown backend '{name}'{suggest(name, backend_ids())} "
                            f"(choose from: {', '.join(backend_ids())})")
    return found


def default_backend(vendor: str) -> Backend | None:
    """The backend a device of ``vendor`` runs llama.cpp on by default ("cpu" for the host), None where llama.cpp
    has none for it."""
    for b in load_backends():
        if vendor in b.default_for_vendors:
            return b
    return None


def scenario_backend(requested: str | None, vendor: str, device_name: str, engine: str) -> Backend | None:
    """The llama.cpp backend a prediction describes: ``requested`` (a name; BenchcalError where unknown, where the
    device's vendor cannot run it, or for another engine) else the vendor's default; None for vLLM, whose kernels
    are its own."""
    if engine != "llama.cpp":
        if requested:
            raise BenchcalError(f"--backend {requested}: the backend is llama.cpp's ({engine} was asked for)")
        return None
    if not requested:
        return default_backend(vendor)
    backend = resolve_backend(requested)
    if vendor not in backend.runs_on_vendors:
        raise BenchcalError(f"--backend {backend.id} does not run on {device_name} "
                            f"(llama.cpp's {backend.id} backend runs on: {', '.join(backend.runs_on_vendors)})")
    return backend
