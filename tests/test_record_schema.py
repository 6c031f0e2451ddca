"""The run record's schema: one typed record, its migrations, and a published JSON Schema that agrees with the checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from harness import record_schema, records
from harness.record_schema import RunRecord, json_schema, migrate, validate_record

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "harness" / "schema" / "run-record.schema.json"


def _shipped() -> list[dict]:
    return [run.record for run in records.iter_records(ROOT / "runs")]


def test_the_published_json_schema_is_the_one_the_module_generates():
    assert json.loads(PUBLISHED.read_text(encoding="utf-8")) == json_schema(), (
        "regenerate it: python -m harness.record_schema > harness/schema/run-record.schema.json")
    jsonschema.Draft202012Validator.check_schema(json_schema())


def test_every_shipped_record_passes_the_published_schema_and_reads_back_typed():
    schema = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    shipped = _shipped()
    assert len(shipped) > 300
    validator = jsonschema.Draft202012Validator(schema)
    for record in shipped:
        assert not list(validator.iter_errors(record)), record["id"]
        typed = RunRecord.from_dict(record)
        assert typed.to_dict() == record and list(typed.to_dict()) == list(record)
        assert typed.engine == record["config"]["engine"]


def _broken() -> list[tuple[str, dict]]:
    good = records.new_record({"model": "smollm2-135m", "prompt_tokens": [16]}, measurements={
        "decode": {"decode_tok_s": records.summarize([10.0, 11.0])}})
    cases = []
    for name, change in [
        ("no status", lambda r: r.pop("status")),
        ("bad status", lambda r: r.update(status="exploded")),
        ("bad id", lambda r: r.update(id="x")),
        ("bad hash", lambda r: r.update(config_hash="abc")),
        ("unknown engine", lambda r: r["config"].update(engine="tgi")),
        ("empty model", lambda r: r["config"].update(model="")),
        ("config key missing", lambda r: r["config"].pop("context")),
        ("prompt lengths not a list", lambda r: r["config"].update(prompt_tokens=16)),
        ("summary without n", lambda r: r["measurements"]["decode"]["decode_tok_s"].pop("n")),
        ("bad peak source", lambda r: r["memory"].update(peak_source="guess")),
        ("bad provenance", lambda r: r["provenance"].update(source="rumour")),
        ("log tail not a list", lambda r: r.update(log_tail="oops")),
        ("newer schema", lambda r: r.update(schema_version=2)),
    ]:
        record = copy.deepcopy(good)
        change(record)
        cases.append((name, record))
    return [("good", good), *cases]


@pytest.mark.parametrize("name,record", _broken(), ids=[n for n, _ in _broken()])
def test_the_json_schema_and_validate_record_agree(name, record):
    schema_ok = not list(jsonschema.Draft202012Validator(json_schema()).iter_errors(record))
    try:
        validate_record(record)
        checks_ok = True
    except ValueError:
        checks_ok = False
    assert schema_ok == checks_ok == (name == "good")


def test_migrations_bring_an_old_record_forward_and_refuse_a_newer_one(monkeypatch):
    record = _shipped()[0]
    assert migrate(record) is record  # the current version: nothing to do
    old = dict(record, schema_version=0)
    with pytest.raises(ValueError, match="no migration to 1"):
        migrate(old)
    monkeypatch.setitem(record_schema.MIGRATIONS, 0, lambda r: {**r, "schema_version": 1, "reason": "migrated"})
    assert migrate(old)["reason"] == "migrated" and old["schema_version"] == 0
    with pytest.raises(ValueError, match="newer than this benchcal reads"):
        migrate(dict(record, schema_version=record_schema.SCHEMA_VERSION + 1))


def test_new_record_writes_the_typed_record():
    record = records.new_record({"model": "smollm2-135m"}, status="oom", reason="out of memory",
                                prediction_error={"kind": "oom_predicted_fits"})
    assert list(record)[: len(records.RECORD_KEYS)] == list(records.RECORD_KEYS)
    assert RunRecord.from_dict(record).extra == {"prediction_error": {"kind": "oom_predicted_fits"}}
