"""The model catalogue (``predictor/data/models/<id>.json``) and model-name resolution.

Each catalogue file holds a model's published ``config.json`` fields (``config``), the URL they come
from (``source``), its published parameter total with a source, and aliases. :func:`resolve_model`
accepts a catalogue id, a Hugging Face id, forgiving spellings of either (case, ``-instruct``/``-it``
suffixes, ``org/`` prefix, ``qwen2.5:72b`` tags), an alias, or a path to a ``config.json``, a Hugging
Face model directory or a ``.gguf`` file.
"""

from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from predictor.architecture import (
    ModelArch,
    RopeScaling,
    from_hf_config,
    read_config_json,
    rope_scaling_from_config,
)
from predictor.checkpoints import from_gguf, from_hf_dir
from predictor.errors import BenchcalError, suggest

MODELS_DIR = Path(__file__).parent / "data" / "models"

_SUFFIXES = ("-instruct", "-it", "-chat", "-hf")


def normalize_model_name(name: str) -> str:
    """Canonical lookup key: lowercase, no org prefix, ``:``/``_``/spaces as ``-``, no chat suffix,
    ``llama3``/``gemma3``/``phi4`` spelled ``llama-3``/``gemma-3``/``phi-4``, no ``meta-`` prefix."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"[:_\s]+", "-", key)
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key, changed = key[: -len(suffix)], True
    if key.startswith("meta-llama"):
        key = key[len("meta-"):]
    return re.sub(r"^(llama|gemma|phi)(\d)", r"\1-\2", key)


@lru_cache(maxsize=1)
def load_catalogue_entries() -> tuple[dict[str, Any], ...]:
    """The raw catalogue files, sorted by id (each with its ``config`` and published figures)."""
    entries = []
    for path in sorted(MODELS_DIR.glob("*.json")):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BenchcalError(f"model catalogue file {path} is not valid JSON: {exc.msg}") from exc
        entry["_path"] = str(path)
        entries.append(entry)
    return tuple(sorted(entries, key=lambda e: e["id"]))


def documented_rope_scaling(entry: dict[str, Any]) -> RopeScaling | None:
    """The long-context setting a catalogue entry's model card documents (``long_context``: the card's
    ``rope_scaling`` block, its ``source`` and a ``note``), as a :class:`RopeScaling` not in the config."""
    long = entry.get("long_context")
    if not long:
        return None
    lang = entry["config"].get("text_config") or entry["config"]
    found = rope_scaling_from_config({"rope_scaling": long["rope_scaling"]}, int(lang["max_position_embeddings"]),
                                     long["source"])
    if found is None:
        raise BenchcalError(f"model catalogue entry {entry['id']}: long_context.rope_scaling is not a known scaling")
    return dataclasses.replace(found, in_config=False, note=long.get("note", ""))


def _arch_from_entry(entry: dict[str, Any]) -> ModelArch:
    arch = from_hf_config(
        entry["config"], id=entry["id"], name=entry.get("name"), hf_id=entry.get("hf_id"), source=entry["source"],
        published_params_b=entry.get("published_params_b"),
        published_params_source=entry.get("published_params_source"),
        params_extra=int(entry.get("extra_params") or 0),
        documented_rope_scaling=documented_rope_scaling(entry),
    )
    gguf = entry.get("gguf")
    if gguf:  # the GGUF repository its launch commands download, and how its files were converted
        width = gguf.get("intermediate_size")
        if width is not None and (not isinstance(width, int) or width < arch.intermediate_size):
            raise BenchcalError(f"model catalogue entry {entry['id']}: gguf.intermediate_size must be a whole number "
                                f"no smaller than the config's {arch.intermediate_size}")
        arch = dataclasses.replace(arch, gguf_repo=str(gguf["repo"]), gguf_intermediate_size=width)
    return arch


@lru_cache(maxsize=1)
def load_catalogue() -> tuple[ModelArch, ...]:
    """Every catalogue model as a :class:`ModelArch`, sorted by id (cached)."""
    return tuple(_arch_from_entry(entry) for entry in load_catalogue_entries())


def model_ids() -> list[str]:
    """Catalogue ids, sorted."""
    return [arch.id for arch in load_catalogue()]


@lru_cache(maxsize=1)
def _lookup() -> dict[str, ModelArch]:
    """Normalized name -> model, over ids, Hugging Face ids and aliases."""
    table: dict[str, ModelArch] = {}
    for entry, arch in zip(load_catalogue_entries(), load_catalogue(), strict=True):
        names = [entry["id"], entry.get("hf_id") or "", *entry.get("aliases", [])]
        for name in filter(None, names):
            for key in {name.lower(), normalize_model_name(name)}:
                holder = table.setdefault(key, arch)
                if holder.id != arch.id:
                    raise BenchcalError(f"model catalogue: name '{name}' is claimed by {holder.id} and {arch.id}")
    return table


def _looks_like_path(spec: str) -> bool:
    return (spec.startswith(("/", "./", "../", "~")) or spec.lower().endswith((".gguf", ".json"))
            or "\\" in spec or spec.count("/") > 1)


def _from_path(path: Path) -> ModelArch:
    if path.is_dir():
        return from_hf_dir(path)
    if path.suffix.lower() == ".gguf":
        return from_gguf(path)
    if path.suffix.lower() == ".json":
        model_dir = path.parent
        arch_id = (model_dir.name or path.stem).lower()
        return from_hf_config(read_config_json(path), id=arch_id, name=model_dir.name or path.stem,
                              source=str(path))
    raise BenchcalError(f"cannot read a model from {path}: expected a .gguf file, a config.json "
                        "or a Hugging Face model directory")


def resolve_model(spec: str) -> ModelArch:
    """Find a model by catalogue id, Hugging Face id, alias or forgiving variant, or read it from a path
    (``.gguf``, ``config.json`` or model directory). An existing file, or a directory holding a
    config.json, wins over a catalogue name."""
    if not isinstance(spec, str) or not spec.strip():
        raise BenchcalError("model must be a catalogue id, a Hugging Face id or a path")
    spec = spec.strip()
    path = Path(spec).expanduser()
    if path.is_file() or (path / "config.json").is_file():
        return _from_path(path)
    table = _lookup()
    for key in (spec.lower(), normalize_model_name(spec)):
        if key in table:
            return table[key]
    if path.exists():
        return _from_path(path)  # a directory without config.json: raises a message saying so
    if _looks_like_path(spec):
        raise BenchcalError(f"model path '{spec}' does not exist")
    candidates = model_ids() + [e["hf_id"] for e in load_catalogue_entries() if e.get("hf_id")]
    hint = suggest(normalize_model_name(spec), model_ids()) or suggest(spec, candidates)
    raise BenchcalError(f"unknown model '{spec}'{hint}; a model outside the catalogue works from its config.json, "
                        "its Hugging Face folder or a .gguf file: pass the path")
