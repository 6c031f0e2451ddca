"""Sweep files: expansion, defaults, and resuming a real sweep without re-measuring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import records, sweep
from predictor.errors import BenchcalError

REPO = Path(__file__).resolve().parents[1]

SWEEP = """
name = "tiny"
[defaults]
engine = "llama.cpp"
device = "auto"
context = 256
prompt_tokens = [16]
gen_tokens = 4
reps = 2
warmup = 0
arch_overrides = { num_layers = 2, vocab_size = 2048 }
engine_options = { threads = 1 }

[[configs]]
model = "smollm2-135m"
quant = ["Q4_0", "Q8_0"]
"""


def test_lists_expand_and_engine_options_merge(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace('quant = ["Q4_0", "Q8_0"]',
                                  'quant = ["Q4_0", "Q8_0"]\ncontext = [256, 512]\nengine_options = { flash_attn = true }'))
    loaded = sweep.load_sweep(str(path))
    assert len(loaded.configs) == 4
    assert {(c["quant"], c["context"]) for c in loaded.configs} == {("Q4_0", 256), ("Q4_0", 512), ("Q8_0", 256),
                                                                      ("Q8_0", 512)}
    assert all(c["engine_options"] == {"threads": 1, "flash_attn": True} for c in loaded.configs)
    assert all(c["prompt_tokens"] == [16] for c in loaded.configs)


def test_shipped_sweeps_parse():
    smoke = sweep.load_sweep("cpu-smoke")
    assert smoke.configs and all(c["device"] == "cpu" for c in smoke.configs)
    assert sweep.load_sweep("gpu-calibration").configs


def test_bad_sweep_files_are_user_errors(tmp_path):
    with pytest.raises(BenchcalError, match="shipped sweeps"):
        sweep.load_sweep("no-such-sweep")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[configs]]\nquant = 'Q4_0'\n")
    with pytest.raises(BenchcalError, match="no model"):
        sweep.load_sweep(str(bad))
    bad.write_text("[defaults\n")
    with pytest.raises(BenchcalError, match="not valid TOML"):
        sweep.load_sweep(str(bad))


@pytest.mark.engine
def test_sweep_resumes_without_measuring_again(tmp_path, tmp_path_factory):
    path = tmp_path / "tiny.toml"
    path.write_text(SWEEP)
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "BENCHCAL_CACHE": str(tmp_path_factory.getbasetemp() / "benchcal-cache")}
    command = [sys.executable, "-m", "benchcal", "bench", "--gpu", "cpu", "--sweep", str(path), "--runs-dir", str(runs)]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    assert "2 to run, 0 already measured" in first.stderr
    assert "measured vs predicted" in first.stdout
    stored = list(records.iter_records(runs))
    assert sorted(r.record["config"]["quant"] for r in stored) == ["Q4_0", "Q8_0"]
    assert all(r.record["config"]["arch_overrides"] == {"num_layers": 2, "vocab_size": 2048} for r in stored)
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    assert "0 to run, 2 already measured" in second.stderr
    assert len(list(records.iter_records(runs))) == 2
