"""The bench and runs subcommands: argument errors, device checks, listing stored runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchcal.commands import bench
from harness import records
from predictor.errors import BenchcalError

REPO = Path(__file__).resolve().parents[1]


def benchcal(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "benchcal", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def stored_runs(root: Path) -> None:
    ok = records.new_record({"model": "smollm2-135m", "quant": "Q8_0", "prompt_tokens": [64]},
                            provenance={"started_at": "2026-01-01T00:00:00Z"})
    failed = records.new_record({"model": "qwen2.5-0.5b", "quant": "Q4_0"}, status="oom", reason="failed to allocate")
    records.write_record(ok, root)
    records.write_record(failed, root)


def test_a_gpu_this_machine_does_not_have_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(bench, "_nvml_gpu_name", lambda: None)
    with pytest.raises(BenchcalError, match="no NVIDIA GPU"):
        bench.resolve_bench_device("l4")
    monkeypatch.setattr(bench, "_nvml_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    with pytest.raises(BenchcalError, match="this machine's GPU is NVIDIA H100"):
        bench.resolve_bench_device("l4")
    assert bench.resolve_bench_device("cpu") == "cpu"


def test_auto_picks_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(bench, "_nvml_gpu_name", lambda: None)
    assert bench.resolve_bench_device("auto") == "cpu"


def test_bench_user_errors_exit_2_with_one_line():
    result = benchcal("bench", "--gpu", "cpu", "--model", "smollm2-135m", "--prompt", "64,abc")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("benchcal: error: --prompt")
    result = benchcal("bench", "--gpu", "cpu", "--model", "smollm2-135m", "--ctx", "128", "--prompt", "512")
    assert result.returncode == 2 and "does not fit a context of 128" in result.stderr


def test_bench_help_has_an_example():
    result = benchcal("bench", "--help")
    assert result.returncode == 0 and "examples:" in result.stdout and "benchcal bench --gpu cpu" in result.stdout


def test_runs_lists_table_json_and_csv(tmp_path):
    stored_runs(tmp_path)
    table = benchcal("runs", "--runs-dir", str(tmp_path))
    assert table.returncode == 0 and "smollm2-135m" in table.stdout and "oom" in table.stdout
    listed = json.loads(benchcal("runs", "--runs-dir", str(tmp_path), "--format", "json").stdout)
    assert sorted(r["status"] for r in listed) == ["ok", "oom"]
    csv = benchcal("runs", "--runs-dir", str(tmp_path), "--format", "csv", "--status", "oom").stdout.splitlines()
    assert csv[0].startswith("id,status,reason,model") and len(csv) == 2


def test_runs_reads_the_environment_directory(tmp_path):
    stored_runs(tmp_path)
    listed = benchcal("runs", "--format", "json", env_extra={"BENCHCAL_RUNS": str(tmp_path)})
    assert len(json.loads(listed.stdout)) == 2
