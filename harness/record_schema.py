"""The run record's schema in one place: its constants, the typed :class:`RunRecord`, the migrations from older
schema versions, the checks every stored record passes (:func:`validate_record`) and the JSON Schema published
for other tools (``harness/schema/run-record.schema.json``, generated from this module; regenerate it with
``python -m harness.record_schema > harness/schema/run-record.schema.json``; a test keeps the file and the module
in step). :func:`validate_record` checks a record against that same schema with ``jsonschema``; no engine is
imported, like :mod:`harness.records`, which stores and reads the records.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.engines import ENGINES
from harness.schemacheck import first_error

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "crash", "timeout", "interrupted")
MODEL_SOURCES = ("catalogue", "path")
PEAK_SOURCES = ("nvml_process", "nvml_device", "rss_tree")
PROVENANCE_SOURCES = ("measured", "imported")


# Defaults applied by :func:`normalize_config`; every record's config carries all of these keys.
CONFIG_DEFAULTS: dict[str, Any] = {
    "model": None,
    "model_source": "catalogue",
    "weights": "synthetic",
    "quant": None,
    "engine": "llama.cpp",
    "device": "cpu",
    "device_count": 1,
    "context": 2048,
    "batch": 1,
    "kv_dtype": "f16",
    "prompt_tokens": [],
    "gen_tokens": 32,
    "reps": 5,
    "warmup": 1,
    "offload_fraction": 0.0,
    "engine_options": {},
}

RECORD_KEYS = (
    "schema_version",
    "id",
    "config_hash",
    "status",
    "reason",
    "config",
    "measurements",
    "memory",
    "prediction",
    "planned",
    "provenance",
    "log_tail",
)

_ID_PATTERN = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{10}-[0-9a-f]{4}$")
_HASH_PATTERN = re.compile(r"^[0-9a-f]{64}$")


# Migrations: schema version n -> a function turning a version-n record into a version-(n + 1) record. Version 1 is
# the first published schema, so there is none yet; a record of a later version than this module knows is refused.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def migrate(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` brought to :data:`SCHEMA_VERSION` through :data:`MIGRATIONS` (a copy when anything changes);
    ValueError for a version this module cannot read (newer, or older without a migration)."""
    version = record.get("schema_version") if isinstance(record, dict) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"unsupported schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise ValueError(f"unsupported schema_version {version!r}: newer than this benchcal reads "
                         f"({SCHEMA_VERSION}); upgrade benchcal")
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise ValueError(f"unsupported schema_version {version!r}: no migration to {version + 1}")
        record = MIGRATIONS[version](copy.deepcopy(record))
        version = record["schema_version"]
    return record


@dataclass
class RunRecord:
    """One run, typed: the keys every record holds (:data:`RECORD_KEYS`) and ``extra``, its other top-level
    keys (``prediction_error``, ``prediction_reason``, ...). :meth:`to_dict` gives the JSON document stored on
    disk, :meth:`from_dict` reads one back (migrated and checked)."""

    id: str
    config_hash: str
    config: dict[str, Any]
    status: str = "ok"
    reason: str | None = None
    measurements: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    planned: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=lambda: {"source": "measured"})
    log_tail: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> RunRecord:
        """The typed record of a stored document; ValueError naming the first problem."""
        document = migrate(dict(record))
        validate_record(document)
        known = {key: document[key] for key in RECORD_KEYS}
        return cls(**known, extra={k: v for k, v in document.items() if k not in RECORD_KEYS})

    def to_dict(self) -> dict[str, Any]:
        """The stored document: the schema's keys in their order, then the extra keys."""
        document = {key: getattr(self, key) for key in RECORD_KEYS}
        document.update(self.extra)
        return document

    @property
    def engine(self) -> str:
        return str(self.config["engine"])

    @property
    def device(self) -> str:
        return str(self.config["device"])

    @property
    def model(self) -> str:
        return str(self.config["model"])


# --------------------------------------------------------------------------------------------- validation


def validate_record(record: Any) -> None:
    """Raise ValueError naming the first problem when ``record`` is not a well-formed run record: the published
    JSON Schema (:func:`json_schema`), checked with :mod:`harness.schemacheck`."""
    if not isinstance(record, dict):
        raise ValueError("record must be a JSON object")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION and "schema_version" in record:
        raise ValueError(f"unsupported schema_version {version!r}"
                         + (" (migrate it first: harness.record_schema.migrate)" if version in MIGRATIONS else ""))
    problem = first_error(record, _SCHEMA)
    if problem:
        raise ValueError(f"record: {problem}")


# ------------------------------------------------------------------------------------------------ JSON Schema

_SUMMARY_KEYS = ("samples", "median", "mean", "stddev", "p10", "p90", "n")


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a stored run record: what :func:`validate_record` checks."""
    summary = {"type": "object", "required": list(_SUMMARY_KEYS),
               "properties": {"samples": {"type": "array", "items": {"type": "number"}}, "n": {"type": "integer"}}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "benchcal run record",
        "description": "One measured (or failed) configuration, as benchcal stores it: "
                       "<runs>/<engine>/<device>/<model>/<id>.json. Times carry their unit in the key (ttft_ms, "
                       "load_s), throughputs are tokens per second (*_tok_s), memory is in bytes (*_bytes).",
        "type": "object",
        "required": list(RECORD_KEYS),
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "id": {"type": "string", "pattern": _ID_PATTERN.pattern},
            "config_hash": {"type": "string", "pattern": _HASH_PATTERN.pattern},
            "status": {"enum": list(STATUSES)},
            "reason": _nullable("string"),
            "config": {
                "type": "object",
                "required": list(CONFIG_DEFAULTS),
                "properties": {
                    "model": {"type": "string", "minLength": 1},
                    "engine": {"enum": list(ENGINES)},
                    "prompt_tokens": {"type": "array", "items": {"type": "integer"}},
                    "engine_options": {"type": "object"},
                },
            },
            "measurements": {
                "type": "object",
                "properties": {
                    "prefill": {"type": ["array", "null"], "items": {
                        "type": "object", "required": ["prompt_tokens"],
                        "properties": {"ttft_ms": summary, "prefill_tok_s": summary}}},
                    "decode": {"type": ["object", "null"], "properties": {"decode_tok_s": summary}},
                },
            },
            "memory": {"type": "object", "properties": {"peak_source": {"enum": [*PEAK_SOURCES, None]}}},
            "prediction": _nullable("object"),
            "planned": _nullable("object"),
            "provenance": {"type": "object", "required": ["source"],
                           "properties": {"source": {"enum": list(PROVENANCE_SOURCES)}}},
            "log_tail": {"type": "array", "items": {"type": "string"}},
        },
    }


_SCHEMA = json_schema()

if __name__ == "__main__":
    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
