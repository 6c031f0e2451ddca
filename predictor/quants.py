"""Weight quantization formats and KV-cache dtypes, with the engines that run each.

Loaded from ``predictor/data/quants.json``. ``quality``, where measured: the format's perplexity against F16's on
one model, with its source (llama.cpp's CI: OpenLLaMA 7B v2 on wikitext-2), and :func:`quality_tier` its band.
Sizes: ``bits_per_weight`` is the average number of
bits a real file spends per weight, block scales included; ``bytes_per_element`` is the storage of
one cached K or V value, block scales included (q8_0: 34 bytes per 32 values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor.engines import ENGINES
from predictor.errors import BenchcalError, suggest

QUANTS_PATH = Path(__file__).with_name("data") / "quants.json"

_ENGINE_ALIASES = {"llamacpp": "llama.cpp", "llamacpppython": "llama.cpp", "vllm": "vllm"}


@dataclass(frozen=True)
class QuantFormat:
    """A weight format. ``bits_per_weight`` is None only for per-model mixes (size them from the file)."""

    id: str
    name: str
    bits_per_weight: float | None
    bits_per_weight_non_expert: float | None
    engines: tuple[str, ...]
    gguf_type: str | None
    llama_ftype: int | None
    compute_bits: int
    source: str
    description: str
    aliases: tuple[str, ...] = ()
    quality: Mapping[str, Any] | None = None  # measured perplexity against F16 on one model, with its source
    embedding_bits: float | None = None  # bits of the input embedding and LM head, where the format keeps them wider

    @property
    def perplexity_increase_pct(self) -> float | None:
        """How much higher the format's perplexity was than F16's, in percent, where ``quality`` says."""
        q = self.quality
        if not q:
            return None
        return round((float(q["perplexity"]) / float(q["f16_perplexity"]) - 1.0) * 100.0, 2)

    def weight_bits(self, is_expert: bool = False) -> float | None:
        """Bits per weight for one tensor: MoE-only formats keep non-expert tensors at their own width."""
        if not is_expert and self.bits_per_weight_non_expert is not None:
            return self.bits_per_weight_non_expert
        return self.bits_per_weight

    def supports(self, engine: str) -> bool:
        """True when ``engine`` ("llama.cpp" or "vllm") loads weights in this format."""
        return engine in self.engines


@dataclass(frozen=True)
class KvDtype:
    """A KV-cache element type; ``bytes_per_element`` includes block scales."""

    id: str
    bytes_per_element: float
    engines: tuple[str, ...]
    source: str
    aliases: tuple[str, ...] = ()
    description: str = ""

    def supports(self, engine: str) -> bool:
        """True when ``engine`` can store its KV cache in this type."""
        return engine in self.engines


def _key(text: str) -> str:
    """Matching key: upper case with everything but letters and digits removed ("q4_k_m" -> "Q4KM")."""
    return "".join(ch for ch in text.upper() if ch.isalnum())


@lru_cache(maxsize=1)
def _data() -> tuple[tuple[QuantFormat, ...], tuple[KvDtype, ...]]:
    raw = json.loads(QUANTS_PATH.read_text(encoding="utf-8"))
    formats = tuple(
        QuantFormat(
            id=r["id"], name=r["name"], bits_per_weight=r["bits_per_weight"],
            bits_per_weight_non_expert=r["bits_per_weight_non_expert"], engines=tuple(r["engines"]),
            gguf_type=r["gguf_type"], llama_ftype=r["llama_ftype"], compute_bits=int(r["compute_bits"]),
            source=r["source"], description=r["description"], aliases=tuple(r.get("aliases", ())),
            quality=r.get("quality"), embedding_bits=r.get("embedding_bits"),
        )
        for r in raw["formats"]
    )
    kv_dtypes = tuple(
        KvDtype(id=r["id"], bytes_per_element=float(r["bytes_per_element"]), engines=tuple(r["engines"]),
                source=r["source"], aliases=tuple(r.get("aliases", ())), description=r.get("description", ""))
        for r in raw["kv_dtypes"]
    )
    _check_unique("quant", [(f.id, (f.id, *f.aliases)) for f in formats])
    _check_unique("KV dtype", [(k.id, (k.id, *k.aliases)) for k in kv_dtypes])
    return formats, kv_dtypes


def _check_unique(what: str, entries: list[tuple[str, tuple[str, ...]]]) -> None:
    seen: dict[str, str] = {}
    for owner, names in entries:
        for name in names:
            other = seen.setdefault(_key(name), owner)
            if other != owner:
                raise ValueError(f"quants.json: {what} name {name!r} matches both {other!r} and {owner!r}")


# Quality tiers of a format's perplexity increase over F16 (benchcal's own bands, applied to the figure
# ``quality`` cites): under 0.5% is within the measurement's noise on 8K tokens.
QUALITY_TIERS = ((0.5, "near-lossless"), (2.0, "good"), (5.0, "fair"), (float("inf"), "poor"))


def quality_tier(increase_pct: float | None) -> str | None:
    """The tier of a perplexity increase in percent (:data:`QUALITY_TIERS`); None when not measured."""
    if increase_pct is None:
        return None
    return next(label for bound, label in QUALITY_TIERS if increase_pct < bound)


def normalize_engine(engine: str) -> str:
    """Canonical engine name ("llama.cpp" or "vllm"); BenchcalError for anything else."""
    canonical = _ENGINE_ALIASES.get("".join(ch for ch in engine.lower() if ch.isalnum()))
    if canonical is None:
        raise BenchcalError(f"unknown engine {engine!r}{suggest(engine, ENGINES)}")
    return canonical


def quant_formats() -> list[QuantFormat]:
    """Every weight format, in file order."""
    return list(_data()[0])


def quant_ids(engine: str | None = None) -> list[str]:
    """Format ids, optionally only those ``engine`` can run."""
    formats = _data()[0]
    if engine is None:
        return [f.id for f in formats]
    canonical = normalize_engine(engine)
    return [f.id for f in formats if canonical in f.engines]


def resolve_quant(name: str, engine: str | None = None) -> QuantFormat:
    """Find a format by id or alias, ignoring case and punctuation ("q4_k_m", "Q4-K-M").

    With ``engine``, a format that engine cannot load raises BenchcalError naming the ones it can.
    """
    wanted = _key(name)
    for fmt in _data()[0]:
        if wanted in {_key(n) for n in (fmt.id, *fmt.aliases)}:
            break
    else:
        raise BenchcalError(f"unknown quant {name!r}{suggest(name, quant_ids())}")
    if engine is not None:
        canonical = normalize_engine(engine)
        if canonical not in fmt.engines:
            raise BenchcalError(f"quant {fmt.id!r} is not supported by {canonical} "
                                f"(supported: {', '.join(quant_ids(canonical))})")
    return fmt


def default_format(arch: Any, engine: str, fallback: str | None = None) -> str:
    """The weights format a prediction takes when none is asked for: the model's own GGUF file's type, else the format
    its release ships in where ``engine`` runs it (gpt-oss's MXFP4, DeepSeek-V3's FP8 on vLLM), else ``fallback``
    (the engine's default format). Every command that picks a format by itself (predict, leaderboard, cost, matrix,
    recommend) goes through here, so they describe the same file."""
    from predictor.engines import traits

    engine = normalize_engine(engine)
    own = getattr(arch, "weights_quant", None)
    if own:
        return str(own)
    release = getattr(arch, "release_format", None)
    if release and release in quant_ids(engine):
        return str(release)
    return fallback or traits(engine).default_quant


def kv_dtypes() -> list[KvDtype]:
    """Every KV-cache dtype, in file order."""
    return list(_data()[1])


def kv_dtype_ids(engine: str | None = None) -> list[str]:
    """KV dtype ids, optionally only those ``engine`` supports."""
    dtypes = _data()[1]
    if engine is None:
        return [k.id for k in dtypes]
    canonical = normalize_engine(engine)
    return [k.id for k in dtypes if canonical in k.engines]


def quantized_kv(name: str) -> bool:
    """Whether a KV dtype is one of llama.cpp's block-quantized types (q8_0, q4_0, ...): a V cache of one needs
    flash attention (llama.cpp's context refuses it otherwise: ``ggml_is_quantized(type_v)`` without flash
    attention, src/llama-context.cpp)."""
    return resolve_kv_dtype(name).id.startswith(("q", "iq"))


def resolve_kv_dtype(name: str, engine: str | None = None) -> KvDtype:
    """Find a KV dtype by id or alias ("q8_0", "fp8_e4m3", "auto" -> f16); check ``engine`` support."""
    wanted = _key(name)
    for dtype in _data()[1]:
        if wanted in {_key(n) for n in (dtype.id, *dtype.aliases)}:
            break
    else:
        raise BenchcalError(f"unknown KV cache dtype {name!r}{suggest(name, kv_dtype_ids())}")
    if engine is not None:
        canonical = normalize_engine(engine)
        if canonical not in dtype.engines:
            raise BenchcalError(f"KV cache dtype {dtype.id!r} is not supported by {canonical} "
                                f"(supported: {', '.join(kv_dtype_ids(canonical))})")
    return dtype
