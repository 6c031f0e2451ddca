"""Faults a real run meets, injected for real: a hung engine, a full disk before and during a run, a read-only runs
dir. Each asserts the record (or the refusal), the exit code and that no engine process is left. Signals (Ctrl-C,
SIGTERM, a killed engine, a killed harness) are in test_harness_signals.py.

The disk faults mount a small tmpfs, which needs root (CAP_SYS_ADMIN); elsewhere they are skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_harness_signals import LONG_RUN, REPO, engine_child

from harness import records

pytestmark = pytest.mark.engine

SHORT_RUN = [*LONG_RUN[:LONG_RUN.index("--reps")], "--reps", "40", *LONG_RUN[LONG_RUN.index("--reps") + 2:]]
# Long enough that the disk fills while the engine still measures: 40 repetitions of this model take about a second
# on a fast host, less than the wait for the engine's log to show it measuring.
FILL_RUN = [*LONG_RUN[:LONG_RUN.index("--reps")], "--reps", "400", *LONG_RUN[LONG_RUN.index("--reps") + 2:]]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "BENCHCAL_CACHE": str(cache)}


def _bench(args: list[str], runs: Path, cache: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchcal", "bench", *args, "--runs-dir", str(runs)],
                            env=_env(cache), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs of the given size (KiB) and options; unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size_kib: int, options: str = "") -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        opts = f"size={size_kib}k" + (f",{options}" if options else "")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()[:100]}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_hung_engine_is_killed_at_the_timeout_and_recorded(tmp_path, tmp_path_factory):
    cache, runs = tmp_path_factory.getbasetemp() / "benchcal-cache", tmp_path / "runs"
    proc = _bench([*LONG_RUN, "--timeout", "25"], runs, cache, tmp_path)
    try:
        child = engine_child(proc, cache)
        child.send_signal(signal.SIGSTOP)  # hung: alive, answering nothing
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _gone(child.pid)
    stored = [run.record for run in records.iter_records(runs)]
    assert [r["status"] for r in stored] == ["timeout"]


def test_a_full_disk_is_refused_before_anything_runs(tmp_path, tmpfs):
    runs = tmpfs(256) / "runs"  # 256 KiB: less than a run needs for its record and log
    p = subprocess.run([sys.executable, "-m", "benchcal", "bench", *SHORT_RUN, "--runs-dir", str(runs)],
                       env=_env(tmp_path / "cache"), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "MiB free" in p.stderr
    assert not (tmp_path / "cache" / "logs").exists() or not list((tmp_path / "cache" / "logs").glob("*.log"))


def test_a_read_only_runs_dir_is_refused_before_anything_runs(tmp_path, tmpfs):
    runs = tmpfs(32 * 1024, "ro")
    p = subprocess.run([sys.executable, "-m", "benchcal", "bench", *SHORT_RUN, "--runs-dir", str(runs)],
                       env=_env(tmp_path / "cache"), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not writable" in p.stderr and "Traceback" not in p.stderr


def test_a_disk_that_fills_during_the_run_loses_no_measurement(tmp_path, tmp_path_factory, tmpfs):
    cache, runs = tmp_path_factory.getbasetemp() / "benchcal-cache", tmpfs(20 * 1024) / "runs"
    proc = _bench(FILL_RUN, runs, cache, tmp_path)
    try:
        engine_child(proc, cache)
        # fill the disk while the engine measures, to the last page: what 64 KiB writes leave would hold a record
        with open(runs.parent / "filler", "wb", buffering=0) as filler:
            for chunk in (65536, 4096, 512, 1):
                try:
                    while True:
                        filler.write(b"\0" * chunk)
                except OSError:
                    pass
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "could not store the record" in out + err
    saved = [run.record for run in records.iter_records(cache / "unsaved-records")]
    assert [r["status"] for r in saved if r["config"]["model"] == "smollm2-135m"][-1:] == ["ok"]
    assert not list(runs.glob("**/*.json"))
