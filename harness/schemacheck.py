"""One JSON Schema checker for everything benchcal reads from outside: run configurations and sweep files
(:mod:`harness.config_schema`), stored run records (:mod:`harness.record_schema`) and imported result files
(:mod:`calibration.import_schema`).

It is ``jsonschema``'s draft 2020-12 validator with two stricter types: an ``integer`` is a whole number that is
not a bool (512.0 is not a token count) and a ``number`` is finite (NaN and infinity compare false with every
bound, so a range alone would let them through). A refusal is one line naming the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema import validators

from predictor.errors import BenchcalError


def _strict_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _finite_number(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)


Validator = validators.extend(jsonschema.Draft202012Validator, type_checker=jsonschema.Draft202012Validator
                              .TYPE_CHECKER.redefine_many({"integer": _strict_integer, "number": _finite_number}))


def _where(error: jsonschema.ValidationError) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties") or {}))
        known = ", ".join(sorted(error.schema.get("properties") or {}))
        return f"unknown key {', '.join(repr(k) for k in extra)} (known: {known})"
    if isinstance(error.instance, float) and not math.isfinite(error.instance):
        return f"{error.instance!r} is not a finite number"
    if error.validator in ("anyOf", "oneOf"):
        # the alternative that says most: a bound or length broken, not "is not of type 'null'"
        telling = [e for e in error.context or [] if e.validator not in ("type", "const", "anyOf", "oneOf")]
        return telling[0].message if telling else f"{error.instance!r} is not a valid value"
    return error.message


_VALIDATORS: dict[int, Any] = {}


def first_error(instance: Any, schema: Mapping[str, Any]) -> str | None:
    """"field: what is wrong" for the first (shallowest) place ``instance`` breaks ``schema``; None when it holds."""
    validator = _VALIDATORS.get(id(schema))
    if validator is None or validator.schema is not schema:
        validator = _VALIDATORS[id(schema)] = Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), list(map(str, e.path))))
    if not errors:
        return None
    where = _where(errors[0])
    return f"{where}: {_message(errors[0])}" if where else _message(errors[0])


def check(instance: Any, schema: Mapping[str, Any], what: str) -> None:
    """BenchcalError naming the first field of ``instance`` that ``schema`` refuses (``what``: the file or thing)."""
    problem = first_error(instance, schema)
    if problem:
        raise BenchcalError(f"{what}: {problem}")
