"""llama.cpp log parsing on real captured logs (tests/data/llama_cpp, provenance in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines.base import classify_failure
from harness.engines.llama_cpp.engine import LlamaCppEngine
from harness.engines.llama_cpp.logparse import LLAMA_OOM_PATTERNS, parse_memory_lines

DATA = Path(__file__).parent / "data" / "llama_cpp"
MIB = 2**20


def mib(value: float) -> int:
    return int(round(value * MIB))


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_current_cpu_log_gives_every_buffer_including_repacked_weights():
    parsed = parse_memory_lines(read("smollm2-4layer-q4_0-cpu.log"))
    assert parsed["buffers"]["model"] == {"CPU_Mapped": mib(10.00), "CPU_REPACK": mib(7.59)}
    assert parsed["weights_bytes"] == mib(10.00) + mib(7.59)
    assert parsed["kv_bytes"] == mib(1.50)
    assert parsed["compute_bytes"] == mib(16.38)
    assert parsed["output_bytes"] == mib(0.02)
    assert parsed["total_bytes"] == mib(10.00) + mib(7.59) + mib(1.50) + mib(16.38) + mib(0.02)
    assert parsed["device_bytes"] == 0 and parsed["host_bytes"] == parsed["total_bytes"]
    assert parsed["offloaded_layers"] is None  # a CPU build prints no offload line


def test_destructor_line_with_size_is_is_not_counted_twice():
    text = read("smollm2-4layer-q8_0-flashattn-kvq8-cpu.log")
    assert "compute buffer size is" in text
    parsed = parse_memory_lines(text)
    assert parsed["compute_bytes"] == mib(14.04)
    assert parsed["kv_bytes"] == mib(0.80)  # q8_0 KV: 512 cells x 4 layers x 2 x 192 values x 34/32 bytes


def test_kv_q8_buffer_matches_block_size_arithmetic():
    kv_bytes = 512 * 4 * 2 * 192 * 34 // 32
    parsed = parse_memory_lines(read("smollm2-4layer-q8_0-flashattn-kvq8-cpu.log"))
    assert abs(parsed["kv_bytes"] - kv_bytes) <= 0.005 * MIB


def test_older_llm_load_tensors_format_with_two_gpus():
    parsed = parse_memory_lines(read("old-llm_load_tensors-cuda-2gpu.log"))
    assert parsed["buffers"]["model"] == {"CPU": mib(1640.62), "CUDA0": mib(5434.38), "CUDA1": mib(13989.53)}
    assert parsed["kv_bytes"] == mib(1536.00) + mib(3584.00)  # per-device lines, not the "KV self size" total again
    assert parsed["output_bytes"] == mib(1.95)
    assert parsed["compute_bytes"] == mib(672.01)
    assert (parsed["offloaded_layers"], parsed["total_layers"]) == (41, 41)
    assert parsed["device_bytes"] == mib(5434.38) + mib(13989.53) + mib(1536.00) + mib(3584.00) + mib(672.01)
    assert parsed["host_bytes"] == mib(1640.62) + mib(1.95)


def test_early_2025_llama_context_format():
    parsed = parse_memory_lines(read("mid-llama_context-cuda.log"))
    assert parsed["kv_bytes"] == mib(192.00)
    assert parsed["buffers"]["compute"] == {"CUDA0": mib(508.03), "CUDA_Host": mib(23.00)}
    assert parsed["output_bytes"] == mib(0.98)
    assert parsed["weights_bytes"] is None


def test_2023_format_in_mb_totals():
    parsed = parse_memory_lines(read("old-mem-required-2023.log"))
    assert parsed["weights_bytes"] == mib(4560.96)
    assert parsed["kv_bytes"] == mib(1024.00)
    assert parsed["compute_bytes"] == mib(162.13)
    assert (parsed["offloaded_layers"], parsed["total_layers"]) == (0, 35)


def test_log_without_memory_lines_gives_nones():
    parsed = parse_memory_lines("llama_model_loader: loaded meta data\nsomething else\n")
    assert parsed["total_bytes"] is None and parsed["buffers"] == {}


def test_memory_breakdown_is_the_engine_protocol_entry_point():
    text = read("smollm2-4layer-q4_0-cpu.log")
    assert LlamaCppEngine.memory_breakdown(text) == parse_memory_lines(text)


def test_real_kv_allocation_failure_is_classified_oom():
    text = read("smollm2-oom-kv-cpu.log")
    status, reason = classify_failure(1, text, LLAMA_OOM_PATTERNS,
                                      child_error="ValueError: Failed to create llama_context")
    assert status == "oom"
    assert "failed to allocate" in reason


@pytest.mark.parametrize("log_name", ["smollm2-4layer-q4_0-cpu.log", "smollm2-4layer-q8_0-flashattn-kvq8-cpu.log"])
def test_successful_logs_do_not_look_like_oom(log_name):
    assert classify_failure(0, read(log_name), LLAMA_OOM_PATTERNS) == ("ok", None)
