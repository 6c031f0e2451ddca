"""llama.cpp's compute buffer: the predictor's formula against the sizes llama.cpp itself reported
(``sched_reserve: CPU compute buffer size``) in captured logs and in the committed CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.engines.llama_cpp.logparse import parse_memory_lines
from harness.synthetic import resolve_arch
from predictor import memory as mem

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "data" / "llama_cpp"


@pytest.mark.parametrize("log, flash_attn", [("smollm2-4layer-q4_0-cpu.log", False),
                                             ("smollm2-4layer-q8_0-flashattn-kvq8-cpu.log", True)])
def test_compute_buffer_matches_the_captured_logs(log, flash_attn):
    # SmolLM2-135M shrunk to 4 layers and a 4096-token vocabulary, n_ctx 512, n_ubatch 512 (tests/data/llama_cpp)
    reported = parse_memory_lines((LOGS / log).read_text())["compute_bytes"]
    arch = resolve_arch("smollm2-135m", {"num_layers": 4, "vocab_size": 4096})
    assert mem.llama_compute_buffer_bytes(arch, 512, 512, flash_attn) == pytest.approx(reported, rel=0.04)


def test_compute_buffer_matches_every_committed_cpu_run():
    errors = []
    for path in sorted((ROOT / "runs" / "llama.cpp" / "cpu").rglob("*.json")):
        record = json.loads(path.read_text())
        reported = ((record.get("memory") or {}).get("engine_breakdown") or {}).get("compute_bytes")
        if not reported:
            continue
        config, options = record["config"], record["config"]["engine_options"]
        arch = resolve_arch(config["model"], config.get("arch_overrides"))
        predicted = mem.llama_compute_buffer_bytes(arch, config["context"], options["n_ubatch"],
                                                   options["flash_attn"])
        errors.append((abs(predicted / reported - 1.0), path.name))
    assert len(errors) >= 10
    # Within 2% but one: smollm2-135m Q4_0 with flash attention at 2048 tokens reports 102.51 MiB where the
    # same model reports 99.38 MiB without flash attention and 98.25 MiB with Q8_0 and flash attention at 4096
    # (predicted 99.38 MiB: 3.1% under, 3 MiB).
    assert max(errors)[0] <= 0.035, max(errors)
    assert sum(e > 0.02 for e, _ in errors) <= 1, sorted(errors)[-3:]


def test_without_flash_attention_the_scores_take_over_at_long_context():
    # Qwen2.5-7B, n_ubatch 512, 32K cache: the f32 scores (512 x 32768 x 28 heads) exceed the logits
    arch = resolve_arch("qwen2.5-7b", None)
    hidden = 512 * 4 * arch.hidden_size
    off = mem.llama_compute_buffer_bytes(arch, 32768, 512, False)
    on = mem.llama_compute_buffer_bytes(arch, 32768, 512, True)
    assert off == pytest.approx(512 * 32768 * 28 * 4 + 6.5 * hidden)
    assert on == pytest.approx(512 * 4 * arch.vocab_size + 3 * hidden)  # the logits phase
