"""The record store under concurrency: 8 processes writing 50 records each into one runs directory store exactly
400 readable records, each once (records are published by a link that never overwrites, with a fresh suffix when
a name is taken)."""

from __future__ import annotations

import json
import multiprocessing

from harness import records

WRITERS, EACH = 8, 50


def _write(args: tuple[str, int]) -> list[str]:
    root, writer = args
    ids = []
    for i in range(EACH):
        # the same config in every process: same second, same hash prefix, so names collide and must be redrawn
        record = records.new_record({"model": "smollm2-135m", "prompt_tokens": [16], "label": f"{writer}-{i}"},
                                    status="crash", reason=f"writer {writer} record {i}")
        ids.append(records.write_record(record, root).stem)
    return ids


def test_parallel_writers_store_every_record_once_and_intact(tmp_path):
    root = tmp_path / "runs"
    with multiprocessing.get_context("spawn").Pool(WRITERS) as pool:
        returned = [i for ids in pool.map(_write, [(str(root), w) for w in range(WRITERS)]) for i in ids]
    files = sorted(p for p in root.rglob("*.json"))
    assert len(returned) == len(set(returned)) == WRITERS * EACH
    assert len(files) == WRITERS * EACH and {p.stem for p in files} == set(returned)
    reasons = set()
    for path in files:
        record = json.loads(path.read_text())
        records.validate_record(record)
        reasons.add(record["reason"])
    assert len(reasons) == WRITERS * EACH  # no record lost or written twice
    assert not [p for p in root.rglob(".*") if p.is_file()]  # no temporary file left behind
