"""Real llama.cpp runs on the CPU with small synthetic models (no engine figure is made up here)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from harness import protocol, records

pytestmark = pytest.mark.engine

TINY = {"num_layers": 4, "vocab_size": 4096}


@pytest.fixture(scope="module")
def full_run(cache, tmp_path_factory):
    """The whole SmolLM2-135M architecture in Q8_0 (about 140 MB of weights), measured once."""
    runs = tmp_path_factory.mktemp("runs")
    cfg = {"model": "smollm2-135m", "quant": "Q8_0", "context": 512, "prompt_tokens": [16, 48], "gen_tokens": 8,
           "reps": 5, "warmup": 1, "engine_options": {"threads": 1}}
    return protocol.run_config(cfg, runs)


def test_real_run_is_stored_ok_with_positive_timings(full_run):
    record = json.loads(Path(full_run.path).read_text())
    records.validate_record(record)
    assert record["status"] == "ok" and record["reason"] is None
    measurements = record["measurements"]
    assert measurements["load_s"] > 0
    assert [p["prompt_tokens"] for p in measurements["prefill"]] == [16, 48]
    for point in measurements["prefill"]:
        assert point["ttft_ms"]["n"] == 5 and point["ttft_ms"]["median"] > 0
        assert point["prefill_tok_s"]["median"] > 0
        assert point["engine_prefill_tok_s"]["median"] > 0  # llama_perf_context counted the prompt
    decode = measurements["decode"]
    assert decode["gen_tokens"] == 8 and decode["context_at_start"] == 16
    assert decode["decode_tok_s"]["n"] == 5 and decode["decode_tok_s"]["median"] > 0
    assert decode["engine_decode_tok_s"]["median"] > 0
    assert measurements["crosscheck"]["decode"]["engine_over_wall"] > 0


def test_peak_rss_is_above_the_weights_and_the_breakdown_is_parsed(full_run):
    record = full_run.record
    weights_bytes = record["provenance"]["weights_bytes"]
    assert weights_bytes > 100 * 2**20
    memory = record["memory"]
    assert memory["peak_source"] == "rss_tree"
    assert memory["peak_bytes"] > weights_bytes
    assert memory["sample_count"] > 10 and memory["sample_hz"] > 50
    breakdown = memory["engine_breakdown"]
    assert breakdown["weights_bytes"] >= weights_bytes * 0.99  # llama.cpp's model buffers hold every tensor
    assert breakdown["kv_bytes"] == 512 * 30 * 2 * 192 * 2  # f16 KV: cells x layers x K,V x kv width x 2 bytes
    assert breakdown["compute_bytes"] > 0
    assert any("KV buffer size" in line for line in breakdown["raw_lines"])


def test_prediction_and_provenance_are_stored(full_run):
    record = full_run.record
    prediction = record["prediction"]
    assert prediction is not None, record.get("prediction_reason")
    assert prediction["fit"]["verdict"] in ("fits", "tight", "needs offload", "does not fit")
    assert prediction["throughput"]["decode_tok_s"] > 0
    provenance = record["provenance"]
    assert provenance["engine_version"].startswith("llama-cpp-python")
    assert provenance["engine_build"] == "cpu"
    assert provenance["host_bandwidth_gbs"] > 0 and provenance["cpu_cores"] >= 1
    assert provenance["started_at"] <= provenance["finished_at"]
    assert len(record["log_tail"]) > 10


def test_no_engine_process_is_left_after_a_run(full_run):
    me = psutil.Process()
    assert not [p for p in me.children(recursive=True) if "harness.engines.runner" in " ".join(p.cmdline())]


def test_impossible_context_is_recorded_as_oom(cache, tmp_path):
    # a synthetic model whose maximum context is raised to 4M tokens: the configuration is valid, its KV cache
    # cannot be allocated
    cfg = {"model": "smollm2-135m", "quant": "Q4_0", "context": 4_000_000, "prompt_tokens": [16], "gen_tokens": 4,
           "reps": 1, "warmup": 0, "arch_overrides": {"vocab_size": 4096, "max_context": 4_000_000},
           "engine_options": {"threads": 1}}
    outcome = protocol.run_config(cfg, tmp_path)
    assert outcome.record["status"] == "oom"
    assert "allocate" in outcome.record["reason"]
    assert outcome.path.exists()


def test_timeout_kills_the_engine_and_records_timeout(cache, tmp_path):
    cfg = {"model": "smollm2-135m", "quant": "Q4_0", "context": 512, "prompt_tokens": [64], "gen_tokens": 4,
           "reps": 100000, "warmup": 0, "arch_overrides": TINY, "engine_options": {"threads": 1}}
    outcome = protocol.run_config(cfg, tmp_path, timeout_s=3)
    assert outcome.record["status"] == "timeout"
    assert outcome.record["measurements"]["prefill"][0]["ttft_ms"]["n"] > 0  # what was measured is kept
    me = psutil.Process()
    assert not [p for p in me.children(recursive=True) if "harness.engines.runner" in " ".join(p.cmdline())]


@pytest.mark.parametrize("model, quant", [("llama-3.2-1b", "Q4_K_M"), ("qwen3-0.6b", "Q8_0"), ("qwen2.5-0.5b", "F16")])
def test_synthetic_layouts_load_and_decode(cache, tmp_path, model, quant):
    cfg = {"model": model, "quant": quant, "context": 128, "prompt_tokens": [8], "gen_tokens": 4, "reps": 1,
           "warmup": 0, "arch_overrides": {"num_layers": 1, "vocab_size": 2048}, "engine_options": {"threads": 1}}
    record = protocol.run_config(cfg, tmp_path).record
    assert record["status"] == "ok", record["reason"]
    assert record["measurements"]["decode"]["decode_tok_s"]["median"] > 0
