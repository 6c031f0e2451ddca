"""Nothing measured is lost: the runs directory is checked before a run, a record that cannot be stored goes to a
fallback directory, and the half-written files of killed writers are cleaned up on the next start."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from harness import records
from harness.synthetic import remove_stale_partials
from predictor.errors import BenchcalError


def _record() -> dict:
    return records.new_record({"model": "smollm2-135m", "prompt_tokens": [16]}, status="crash", reason="test")


def test_a_runs_directory_that_cannot_hold_a_record_is_refused_before_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BenchcalError, match="is a file"):
        records.ensure_writable(blocker)
    with pytest.raises(BenchcalError, match="not writable"):
        records.ensure_writable(blocker / "runs")  # a file where a folder would be
    assert records.ensure_writable(tmp_path / "new" / "runs").is_dir()


def test_the_cli_refuses_such_a_runs_directory_with_one_line_and_exit_2(tmp_path, capsys):
    from benchcal.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["bench", "--gpu", "cpu", "--model", "smollm2-135m", "--runs-dir", str(blocker)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0]


def test_a_record_that_cannot_be_stored_goes_to_the_fallback_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHCAL_CACHE", str(tmp_path / "cache"))
    real = records.write_record
    target = tmp_path / "runs"

    def disk_full(record, runs_dir, attempts=20):
        if str(runs_dir) == str(target):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(record, runs_dir, attempts)

    monkeypatch.setattr(records, "write_record", disk_full)
    said = []
    record = _record()
    path = records.store_record(record, target, say=said.append)
    assert path.is_relative_to(tmp_path / "cache" / "unsaved-records")
    assert json.loads(path.read_text())["id"] == record["id"]
    assert "No space left on device" in said[0] and str(path) in said[0]


def test_half_written_files_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".model-Q4_0-abc.gguf.{dead_pid}.partial"
    live = tmp_path / f".model-Q8_0-abc.gguf.{__import__('os').getpid()}.partial"
    other = tmp_path / "model.gguf"
    for path in (stale, live, other):
        path.write_bytes(b"x" * 10)
    assert remove_stale_partials(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
