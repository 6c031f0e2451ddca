"""vLLM's memory lines and out-of-memory messages, parsed from real logs (tests/data/vllm, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines.base import classify_failure, find_oom
from harness.engines.vllm.engine import VllmEngine
from harness.engines.vllm.logparse import GIB, MIB, parse_memory_breakdown

DATA = Path(__file__).parent / "data" / "vllm"
OLDER = DATA / "older"
PATTERNS = VllmEngine.oom_patterns
# The error the harness child reports when vLLM's engine core dies during start-up.
CORE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def gib(value: float) -> int:
    return int(round(value * GIB))


# ----------------------------------------------------------------------------- captured on this machine


def test_cpu_pinned_log_gives_exact_weights_and_kv_from_the_inventory():
    breakdown = parse_memory_breakdown(read("cpu_pinned_ok.log"))
    # 2 layers x (qkv 896x1152 + o 896x896 + gate/up/down 3x896x4864) + tied 4096x896 embedding + norms/biases,
    # bf16 (read from the model's modules; the CPU backend prints no weights line).
    assert breakdown["weights_bytes"] == 66_991_360
    # "Explicitly set (0.0/13.46) GiB" agrees (2-decimal GiB) with the KV tensors: 10 blocks x 128 tokens x
    # 2 layers x K,V x 2 kv heads x 64 dims x 2 bytes.
    assert breakdown["kv_bytes"] == 10 * 128 * 2 * 2 * 2 * 64 * 2 == 1_310_720
    assert breakdown["sources"]["weights_bytes"] == "inventory"
    assert breakdown["sources"]["kv_bytes"].startswith("inventory")
    assert breakdown["kv_tokens"] == 1280 and breakdown["kv_device"] == "CPU"
    assert breakdown["max_concurrency"] == 1.25
    assert breakdown["node_total_bytes"] == gib(13.46)
    assert breakdown["total_bytes"] == 66_991_360 + 1_310_720
    assert breakdown["activation_bytes"] is None and breakdown["compute_bytes"] is None
    assert any("Explicitly set" in line for line in breakdown["raw_lines"])


def test_cpu_profiled_log_gives_the_auto_set_pool_and_non_kv_memory():
    breakdown = parse_memory_breakdown(read("cpu_profiled_ok.log"))
    assert breakdown["kv_bytes"] == 3_400_007_680  # the KV tensors; the log's "Auto set (3.17/13.46)" agrees
    assert abs(breakdown["kv_bytes"] - gib(3.17)) < 0.006 * GIB
    assert breakdown["requested_bytes"] == gib(4.04)
    assert breakdown["non_kv_bytes"] == gib(0.87)
    assert breakdown["kv_tokens"] == 3_320_320
    assert breakdown["weights_bytes"] == 66_991_360


@pytest.mark.parametrize("name, message", [
    ("cpu_kv_too_small_oom.log", "To serve at least one request with the model's max seq len (1024)"),
    ("cpu_utilization_oom.log", "is less than desired CPU memory utilization (0.99, 13.33 GiB)"),
])
def test_captured_out_of_memory_failures_are_classified_oom(name, message):
    status, reason = classify_failure(1, read(name), PATTERNS, child_error=CORE_FAILED)
    assert status == "oom"
    assert message in reason


@pytest.mark.parametrize("name", ["cpu_pinned_ok.log", "cpu_profiled_ok.log"])
def test_successful_logs_hold_no_out_of_memory_text(name):
    assert find_oom(read(name), PATTERNS) is None
    assert classify_failure(0, read(name), PATTERNS) == ("ok", None)


def test_a_crash_without_memory_text_stays_a_crash():
    status, reason = classify_failure(1, read("cpu_pinned_ok.log"), PATTERNS, child_error="KeyError: 'x'")
    assert (status, reason) == ("crash", "KeyError: 'x'")


# -------------------------------------------------------------------------- older formats (public threads)


def test_v0_breakdown_line_with_budget_and_blocks():
    breakdown = parse_memory_breakdown((OLDER / "v0_issue11251.log").read_text())
    assert breakdown["weights_bytes"] == gib(7.51)
    assert breakdown["non_torch_bytes"] == gib(0.39)
    assert breakdown["activation_bytes"] == gib(2.53)
    assert breakdown["kv_bytes"] == gib(3.76)
    assert breakdown["compute_bytes"] == gib(0.39) + gib(2.53)
    assert breakdown["total_bytes"] == gib(7.51) + gib(3.76) + gib(0.39) + gib(2.53)
    assert abs(breakdown["total_bytes"] - breakdown["requested_bytes"]) <= 0.02 * GIB  # 14.19 vs 14.20 GiB
    assert breakdown["device_total_bytes"] == gib(15.77)
    assert breakdown["gpu_memory_utilization"] == 0.90
    assert (breakdown["gpu_blocks"], breakdown["cpu_blocks"]) == (3852, 4096)
    assert breakdown["max_concurrency"] == 1.54


def test_v0_breakdown_with_worker_prefix_and_cuda_blocks():
    breakdown = parse_memory_breakdown((OLDER / "v0_issue14452.log").read_text())
    assert breakdown["weights_bytes"] == gib(10.30)
    assert breakdown["kv_bytes"] == gib(14.26)
    assert breakdown["requested_bytes"] == gib(26.66)
    assert breakdown["gpu_blocks"] == 7299


def test_v0_profiling_table_of_pr_10511():
    breakdown = parse_memory_breakdown((OLDER / "v0_pr10511_table.log").read_text())
    assert breakdown["weights_bytes"] == gib(14.96)
    assert breakdown["non_torch_bytes"] == gib(1.79)
    assert breakdown["activation_bytes"] == gib(1.26)
    assert breakdown["kv_bytes"] == gib(53.29)
    assert breakdown["device_total_bytes"] == gib(79.22)


@pytest.mark.parametrize("name, weights_bytes", [
    ("v0_pr3120.log", int(round(244.61 * MIB))),  # "took 244.61 MB": vLLM divided by 2**20
    ("v0_issue13061_weights.log", int(round(13.9476 * GIB))),  # "took 13.9476 GB": divided by 2**30
    ("v0_issue14011.log", int(round(15.4137 * GIB))),  # "Model loading took 15.4137 GB and 9.03 seconds"
    ("v1_pr17122.log", int(round(14.9889 * GIB))),  # V1: "Model loading took 14.9889 GiB and 3.65 seconds"
])
def test_weights_lines_of_every_generation(name, weights_bytes):
    breakdown = parse_memory_breakdown((OLDER / name).read_text())
    assert breakdown["weights_bytes"] == weights_bytes


def test_v1_kv_pool_and_token_capacity():
    v1 = parse_memory_breakdown((OLDER / "v1_issue33263.log").read_text())
    assert v1["kv_bytes"] == gib(18.78) and v1["kv_tokens"] == 175_856 and v1["kv_device"] == "GPU"
    assert v1["weights_bytes"] is None and v1["total_bytes"] is None
    early = parse_memory_breakdown((OLDER / "v1_pr17122.log").read_text())
    assert early["kv_tokens"] == 158_656 and early["max_concurrency"] == 4.84
    assert parse_memory_breakdown((OLDER / "v0_pr3120.log").read_text())["gpu_blocks"] == 76240


def test_v1_cuda_graph_estimate():
    breakdown = parse_memory_breakdown((OLDER / "v1_gpustack_pr251.log").read_text())
    assert breakdown["cuda_graph_estimate_bytes"] == gib(0.36)
    assert breakdown["kv_bytes"] == gib(6.87)


@pytest.mark.parametrize("name, message", [
    ("v0_issue13061_oom.log", "is larger than the maximum number of tokens that can be stored in KV cache (81536)"),
    ("v1_issue34076_oom.log", "(24.0 GiB KV cache is needed"),
])
def test_older_out_of_memory_messages_are_recognised(name, message):
    status, reason = classify_failure(1, (OLDER / name).read_text(), PATTERNS, child_error=CORE_FAILED)
    assert status == "oom" and message in reason


def test_text_without_memory_lines_gives_an_empty_breakdown():
    assert parse_memory_breakdown("hello\nworld\n") == {}
    assert VllmEngine.memory_breakdown("") == {}


def test_the_child_logs_how_the_kv_pool_was_sized():
    pinned = parse_memory_breakdown(read("cpu_pinned_ok.log"))["vllm_options"]
    assert pinned["kv_pool"] == "pinned" and pinned["enforce_eager"] is True
    assert pinned["kv_need_bytes"] == 1_310_720 and pinned["kv_cache_memory_bytes"] == 1_376_256
    assert pinned["effective"]["block_size"] == 128 and pinned["effective"]["num_kv_blocks"] == 10
    profiled = parse_memory_breakdown(read("cpu_profiled_ok.log"))["vllm_options"]
    assert profiled["kv_pool"] == "profiled" and profiled["kv_cache_memory_bytes"] is None
    assert profiled["gpu_memory_utilization"] == 0.3
    # Written before vLLM starts, so a failed start still says what was asked for.
    failed = parse_memory_breakdown(read("cpu_kv_too_small_oom.log"))["vllm_options"]
    assert failed["kv_cache_memory_bytes"] == 1_048_576 and "effective" not in failed
