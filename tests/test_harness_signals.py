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


SERVING_RUN = ["--gpu", "cpu", "--model", "smollm2-135m", "--quant", "Q8_0", "--ctx", "512", "--prompt", "32",
               "--gen", "64", "--threads", "1", "--override", "num_layers=4", "--override", "vocab_size=4096",
               "--serve", "--concurrency", "1", "--requests", "400"]


@pytest.fixture
def serving(tmp_path_factory, tmp_path):
    cache = tmp_path_factory.getbasetemp() / "benchcal-cache"
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCHCAL_CACHE": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "benchcal", "bench", *SERVING_RUN, "--runs-dir", str(runs)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    yield proc, runs
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def server_child(parent: subprocess.Popen, timeout_s: float = 240.0) -> psutil.Process:
    """The server process, once the load is running (its start announced on the harness's output)."""
    deadline = time.monotonic() + timeout_s
    seen = b""
    os.set_blocking(parent.stdout.fileno(), False)
    while time.monotonic() < deadline:
        assert parent.poll() is None, seen.decode(errors="replace")
        seen += parent.stdout.read() or b""
        servers = [p for p in psutil.Process(parent.pid).children(recursive=True)
                   if "llama_cpp.server" in _cmdline(p)]
        if servers and b"concurrency 1, 400 requests" in seen:
            time.sleep(1.0)  # some requests served
            return servers[0]
        time.sleep(0.1)
    raise AssertionError("the server never started serving: " + seen.decode(errors="replace")[-2000:])


def _gone(process: psutil.Process, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(process.pid) or process.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_during_a_serving_run_stops_the_server_and_records_the_run(serving):
    proc, runs = serving
    server = server_child(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    assert _gone(server)
    (stored,) = [run.record for run in records.iter_records(runs)]
    assert stored["status"] == "interrupted" and stored["config"]["serve"]


def test_the_server_dies_with_a_killed_harness(serving):
    proc, _ = serving
    server = server_child(proc)
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(server)
