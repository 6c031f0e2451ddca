"""Ctrl-C and a killed engine in the middle of a real run: the right record, no orphan, nothing lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import records

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]
LONG_RUN = ["--gpu", "cpu", "--model", "smollm2-135m", "--quant", "Q4_0", "--ctx", "512", "--prompt", "64",
            "--gen", "4", "--reps", "100000", "--warmup", "0", "--threads", "1",
            "--override", "num_layers=4", "--override", "vocab_size=4096"]


@pytest.fixture
def bench(tmp_path_factory, tmp_path):
    cache = tmp_path_factory.getbasetemp() / "benchcal-cache"
    runs = tmp_path / "runs"
    earlier = records.write_record(records.new_record({"model": "smollm2-135m"}, status="crash",
                                                      reason="an earlier run"), runs)
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCHCAL_CACHE": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "benchcal", "bench", *LONG_RUN, "--runs-dir", str(runs)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield proc, runs, earlier, earlier.read_bytes(), cache
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _cmdline(process: psutil.Process) -> str:
    """A child's command line; empty when it exits between listing and reading (short-lived helpers)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def engine_child(parent: subprocess.Popen, cache: Path, timeout_s: float = 180.0) -> psutil.Process:
    """The engine process, once it has loaded the model and is measuring (in a fresh cache the host probe runs
    first: up to three rounds when the machine is busy)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert parent.poll() is None, parent.stderr.read().decode()
        children = [p for p in psutil.Process(parent.pid).children(recursive=True)
                    if "harness.engines.runner" in _cmdline(p)]
        logs = sorted((cache / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
        # the run's engine, not the host probe's (an F16 model) that may come first in a fresh cache
        text = logs[-1].read_text(errors="replace") if logs else ""
        if children and "compute buffer size" in text and "file type   = Q4_0" in text:
            time.sleep(1.0)  # some repetitions done
            return children[0]
        time.sleep(0.1)
    raise AssertionError("the engine never started measuring")


def new_records(runs: Path, earlier: Path) -> list[dict]:
    return [run.record for run in records.iter_records(runs) if run.path != earlier]


def test_ctrl_c_writes_an_interrupted_record_and_leaves_no_engine(bench):
    proc, runs, earlier, earlier_bytes, cache = bench
    child = engine_child(proc, cache)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    stored = new_records(runs, earlier)
    assert [r["status"] for r in stored] == ["interrupted"]
    assert stored[0]["measurements"]["prefill"][0]["ttft_ms"]["n"] > 0  # repetitions before Ctrl-C are kept
    assert earlier.read_bytes() == earlier_bytes


def test_killed_engine_is_recorded_as_crash(bench):
    proc, runs, earlier, earlier_bytes, cache = bench
    child = engine_child(proc, cache)
    child.kill()
    assert proc.wait(timeout=60) == 1
    stored = new_records(runs, earlier)
    assert [r["status"] for r in stored] == ["crash"]
    assert "signal 9" in stored[0]["reason"]
    assert earlier.read_bytes() == earlier_bytes
    assert json.loads(earlier_bytes)["reason"] == "an earlier run"


def test_sigterm_to_the_harness_is_handled_like_ctrl_c(bench):
    proc, runs, earlier, _, cache = bench
    child = engine_child(proc, cache)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    assert [r["status"] for r in new_records(runs, earlier)] == ["interrupted"]


def test_engine_dies_with_a_killed_harness(bench):
    proc, _, _, _, cache = bench
    child = engine_child(proc, cache)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child.pid) and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
