"""A real vLLM CPU run through the harness's protocol (no engine figure is made up here).

The model is the Qwen2.5-0.5B architecture shrunk to 2 layers and a 4096-token vocabulary: a config.json
only, loaded by vLLM with random weights (``load_format="dummy"``). The run is the session's one
(``vllm_cpu_run`` in conftest.py, shared with test_vllm_protocol.py): start-up takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

pytest.importorskip("vllm")

from harness import records  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

SHRUNK = {"num_layers": 2, "vocab_size": 4096}
# bf16 weights of that model: 2 x (qkv 896x1152 + o 896x896 + MLP 3x896x4864) + 4096x896 tied embedding
# + biases and norms = 33,495,680 parameters.
WEIGHTS_BYTES = 33_495_680 * 2


@pytest.fixture
def run(vllm_cpu_run):
    """The session's one vLLM run (``VLLM_RUN`` in conftest.py: prompts of 32 and 128 tokens, 16 generated)."""
    return vllm_cpu_run[0]


def test_vllm_run_is_stored_ok_with_positive_timings(run):
    record = json.loads(Path(run.path).read_text())
    records.validate_record(record)
    assert record["status"] == "ok", record["reason"]
    assert record["config"]["engine"] == "vllm" and record["config"]["weights"] == "synthetic"
    measurements = record["measurements"]
    assert measurements["load_s"] > 0
    assert [p["prompt_tokens"] for p in measurements["prefill"]] == [32, 128]
    for point in measurements["prefill"]:
        assert point["ttft_ms"]["n"] == 3 and point["ttft_ms"]["median"] > 0
        assert point["prefill_tok_s"]["median"] > 0
        assert point["engine_prefill_tok_s"]["median"] > 0  # vLLM's RequestStateStats timestamps
    decode = measurements["decode"]
    assert decode["gen_tokens"] == 16 and decode["context_at_start"] == 32
    assert decode["decode_tok_s"]["n"] == 3 and decode["decode_tok_s"]["median"] > 0
    assert decode["engine_decode_tok_s"]["median"] > 0
    # vLLM's engine-core timestamps and the child's per-step timestamps describe the same tokens.
    assert 0.5 < measurements["crosscheck"]["decode"]["engine_over_wall"] < 2.0


def test_vllm_breakdown_and_memory_are_parsed(run):
    memory = run.record["memory"]
    assert memory["peak_source"] == "rss_tree" and memory["peak_bytes"] > WEIGHTS_BYTES
    breakdown = memory["engine_breakdown"]
    assert breakdown["weights_bytes"] == WEIGHTS_BYTES
    # Pinned pool: (512 + 128) tokens + the null block, 2 layers x K,V x 2 heads x 64 x 2 bytes = 768 tokens.
    assert breakdown["kv_tokens"] == 768
    assert breakdown["kv_bytes"] == 768 * 2 * 2 * 2 * 64 * 2
    assert any("KV cache size" in line for line in breakdown["raw_lines"])
    options = breakdown["vllm_options"]
    assert options["kv_pool"] == "pinned" and options["kv_need_bytes"] == breakdown["kv_bytes"]
    assert options["effective"]["num_kv_blocks"] == 768 // 128


def test_vllm_provenance_and_no_engine_process_left(run):
    provenance = run.record["provenance"]
    assert provenance["engine_version"] and provenance["engine_build"] == "cpu"
    assert len(run.record["log_tail"]) > 10
    # The child, vLLM's engine core and its worker are all gone: nothing of this test process is left.
    assert psutil.Process().children(recursive=True) == []
