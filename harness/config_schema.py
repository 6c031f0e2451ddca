"""The JSON Schema of a run configuration (what ``benchcal bench``'s flags build, or a sweep entry once expanded) and
of a sweep file, checked with ``jsonschema`` before anything reads them.

The schemas hold the types and ranges (whole numbers, finite numbers, shares, names, tables) and the keys a
configuration may have, so a misspelt key (``contxt = 4096``) is refused instead of measured at the default. What
depends on more than one field (a prompt that must fit the context, a model's limits, an engine's own options) is
:mod:`harness.runconfig`'s. An error is one line naming the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema import validators

from harness.record_schema import CONFIG_DEFAULTS
from predictor.errors import BenchcalError

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


def _strict_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)  # 512.0 is not a token count


def _finite_number(_checker: Any, instance: Any) -> bool:
    return (isinstance(instance, (int, float)) and not isinstance(instance, bool)
            and math.isfinite(instance))  # NaN and infinity compare false with every bound


_Validator = validators.extend(jsonschema.Draft202012Validator, type_checker=jsonschema.Draft202012Validator
                               .TYPE_CHECKER.redefine_many({"integer": _strict_integer, "number": _finite_number}))


def _where(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return path or "the file"


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties") or {}))
        known = ", ".join(sorted(error.schema.get("properties") or {}))
        return f"unknown key {', '.join(repr(k) for k in extra)} (known: {known})"
    if error.validator in ("anyOf", "oneOf"):
        return f"{error.instance!r} is not a valid value"
    return error.message


def check(instance: Any, schema: Mapping[str, Any], what: str) -> None:
    """BenchcalError naming the first field of ``instance`` that ``schema`` refuses (``what``: the file or thing)."""
    errors = sorted(_Validator(schema).iter_errors(instance), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = errors[0]
        raise BenchcalError(f"{what}: {_where(error)}: {_message(error)}")


def check_config(config: Any) -> None:
    check(config, CONFIG_SCHEMA, "run configuration")


def check_sweep(data: Any, path: Any) -> None:
    check(data, SWEEP_SCHEMA, f"sweep file {path}")
