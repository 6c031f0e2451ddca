"""The record store under concurrency: 8 processes writing 50 records each into one runs directory store exactly
400 readable records, each once (records are published by a link that never overwrites, with a fresh suffix when
a name is taken)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import records

WRITERS, EACH = 8, 50
REPO = Path(__file__).resolve().parents[1]
WRITER = """
import sys
from harness import records
root, writer, each = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(each):
    # the same config in every process: same second, same hash prefix, so names collide and must be redrawn
    record = records.new_record({"model": "smollm2-135m", "prompt_tokens": [16]}, status="crash",
                                reason=f"writer {writer} record {i}")
    print(records.write_record(record, root).stem)
"""


def test_parallel_writers_store_every_record_once_and_intact(tmp_path):
    root = tmp_path / "runs"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(w), str(EACH)], cwd=REPO,
                                stdout=subprocess.PIPE, text=True) for w in range(WRITERS)]
    returned = [line for proc in writers for line in proc.communicate(timeout=120)[0].split()]
    assert all(proc.returncode == 0 for proc in writers)
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
