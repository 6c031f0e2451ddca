"""Every test runs with its own empty user data directory: none reads or writes the user's runs or fits. Engine
tests share one cache of synthetic checkpoints and host probes per session (``cache``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _private_user_data(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path_factory.mktemp("benchcal-home")))
    monkeypatch.delenv("BENCHCAL_RUNS", raising=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """``$BENCHCAL_CACHE`` in the session's temporary directory: synthetic weights and host probes made once."""
    path = tmp_path_factory.getbasetemp() / "benchcal-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCHCAL_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def probed_cache(tmp_path_factory) -> Path:
    """The session's cache (the ``cache`` fixture's directory) with this host's probe in it, made once: the probe
    (about a minute on 2 busy cores) describes the host, not a run, so a test that starts from a cache of its own
    copies ``hostbench/`` from here instead of measuring the host again."""
    path = tmp_path_factory.getbasetemp() / "benchcal-cache"
    if not (path / "hostbench").is_dir():
        subprocess.run([sys.executable, "-m", "harness.hostbench"], cwd=REPO, check=True, capture_output=True,
                       timeout=600, env={**os.environ, "BENCHCAL_CACHE": str(path), "PYTHONPATH": str(REPO)})
    return path


# One real vLLM CPU run shared by the tests that read its record (tests/test_vllm_engine.py and
# tests/test_vllm_protocol.py): vLLM's start-up takes about a minute on 2 cores, the measurements a few seconds.
# The Qwen2.5-0.5B architecture shrunk to 2 layers and a 4096-token vocabulary, random weights from a
# config-only directory; the host is given (a probe describes the machine, not the run).
VLLM_SHRUNK = {"num_layers": 2, "vocab_size": 4096}
VLLM_RUN = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "quant": "BF16", "context": 512, "batch": 1,
            "prompt_tokens": [32, 128], "gen_tokens": 16, "reps": 3, "warmup": 1, "kv_dtype": "f16",
            "arch_overrides": VLLM_SHRUNK}
TEST_HOST = {"bandwidth_gbs": 30.0, "memory_gib": 16.0, "matmul_gflops": 200.0, "cores": 2, "cpu_model": "test cpu",
             "host_id": "cpu-test-avx2-2c"}


@pytest.fixture(scope="session")
def vllm_cpu_run(tmp_path_factory):
    """(outcome, the synthetic directory vLLM loaded) of one run of ``VLLM_RUN``."""
    pytest.importorskip("vllm")
    from harness import protocol, synthetic_hf

    cache_dir = tmp_path_factory.mktemp("vllm-cache")
    runs = tmp_path_factory.mktemp("vllm-runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCHCAL_CACHE", str(cache_dir))
        patch.setenv("BENCHCAL_HOME", str(tmp_path_factory.mktemp("benchcal-home")))
        patch.delenv("BENCHCAL_RUNS", raising=False)
        outcome = protocol.run_config(VLLM_RUN, runs, timeout_s=240, host=TEST_HOST)
        yield outcome, synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", VLLM_SHRUNK)
