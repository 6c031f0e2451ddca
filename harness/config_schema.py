"""The JSON Schema of a run configuration (what ``benchcal bench``'s flags build, or a sweep entry once expanded) and
of a sweep file, checked with :mod:`harness.schemacheck` before anything reads them.

The schemas hold the types and ranges (whole numbers, finite numbers, shares, names, tables) and the keys a
configuration may have, so a misspelt key (``contxt = 4096``) is refused instead of measured at the default. What
depends on more than one field (a prompt that must fit the context, a model's limits, an engine's own options) is
:mod:`harness.runconfig`'s. An error is one line naming the field and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.record_schema import CONFIG_DEFAULTS
from harness.schemacheck import check

_WHOLE = {"type": "integer", "minimum": 1}
_NAME = {"type": ["string", "null"]}
_TABLE = {"type": ["object", "null"]}

CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "benchcal run configuration",
    "type": "object",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "model_source": {"enum": ["catalogue", "path"]},
        "weights": _NAME, "quant": _NAME, "engine": {"type": "string"}, "device": {"type": "string"},
        "kv_dtype": _NAME,
        "device_count": _WHOLE, "context": _WHOLE, "batch": _WHOLE, "reps": _WHOLE,
        "gen_tokens": {"type": "integer", "minimum": 0}, "warmup": {"type": "integer", "minimum": 0},
        "prompt_tokens": {"anyOf": [_WHOLE, {"type": "array", "items": _WHOLE}]},
        "offload_fraction": {"type": "number", "minimum": 0, "maximum": 1},
        "engine_options": _TABLE,
        "arch_overrides": {"type": ["object", "null"], "additionalProperties": _WHOLE},
        "serve": _TABLE,
        "timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "label": {"type": "string"}, "notes": {"type": "string"}, "sweep": {"type": "string"},
        "runs_dir": {"type": "string"},
    },
    "additionalProperties": False,
}
assert set(CONFIG_DEFAULTS) <= set(CONFIG_SCHEMA["properties"])


def _listable(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A field a sweep entry may give as a list of values to expand (one configuration per value)."""
    return {"anyOf": [dict(schema), {"type": "array", "items": dict(schema), "minItems": 1}]}


# a sweep entry may give any scalar field as a list (harness.sweep.expand); prompt lengths are a list already
_ENTRY = {k: (v if k == "prompt_tokens" else _listable(v)) for k, v in CONFIG_SCHEMA["properties"].items()}

SWEEP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "benchcal sweep file",
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "description": {"type": "string"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0},
        "defaults": {"type": "object", "properties": _ENTRY, "additionalProperties": False},
        "configs": {"type": "array", "minItems": 1,
                    "items": {"type": "object", "properties": _ENTRY, "additionalProperties": False}},
    },
    "required": ["configs"],
    "additionalProperties": False,
}


def check_config(config: Any) -> None:
    check(config, CONFIG_SCHEMA, "run configuration")


def check_sweep(data: Any, path: Any) -> None:
    check(data, SWEEP_SCHEMA, f"sweep file {path}")
