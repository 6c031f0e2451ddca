"""A mixture of experts on llama.cpp's CPU backend: its routed experts in F16 go through mul_mat_id's dot
products (ggml-cpu.c), not llamafile's GEMM, and the synthetic checkpoints that measure it (expert-count
overrides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import synthetic
from harness.sweep import load_sweep
from predictor.errors import BenchcalError
from predictor.estimate import evaluate
from predictor.registry import ENGINE_DEFAULTS
from predictor.throughput import lm_head_params

ROOT = Path(__file__).resolve().parent.parent
SHAPE = {"num_layers": 2, "vocab_size": 4096, "num_experts": 32, "experts_per_token": 4}


def test_expert_counts_can_be_overridden_for_a_mixture_of_experts():
    arch = synthetic.resolve_arch("qwen3-30b-a3b", SHAPE)
    full = synthetic.resolve_arch("qwen3-30b-a3b", {"num_layers": 2, "vocab_size": 4096})
    assert (arch.num_experts, arch.experts_per_token, arch.num_layers) == (32, 4, 2)
    # 128 -> 32 experts of the same width: a quarter of the routed weights, half of those a token multiplies
    assert arch.params_expert * 4 == full.params_expert
    routed = arch.params_expert * 4 / 32
    assert routed * 2 == pytest.approx(full.params_expert * 8 / 128)
    spec = synthetic.resolve_spec("qwen3-30b-a3b", SHAPE)
    assert (spec["num_experts"], spec["experts_per_token"]) == (32, 4)
    mixtral = synthetic.resolve_arch("mixtral-8x7b", {"num_layers": 1, "num_experts": 4, "experts_per_token": 1})
    assert (mixtral.num_experts, mixtral.experts_per_token) == (4, 1)  # num_local_experts in its config


@pytest.mark.parametrize(("model", "overrides", "message"), [
    ("smollm2-135m", {"num_experts": 8}, "has no experts"),
    ("qwen3-30b-a3b", {"num_experts": 4}, r"experts_per_token \(8\) cannot exceed num_experts \(4\)"),
    ("qwen3-30b-a3b", {"experts_per_token": 0}, "must be positive"),
])
def test_expert_overrides_that_cannot_be_are_refused(model, overrides, message):
    with pytest.raises(BenchcalError, match=message):
        synthetic.resolve_arch(model, overrides)


def _prefill_s(arch, quant_float: float, vecdot: float, tokens: float = 256.0) -> float:
    coeffs = {name: value for name, (value, _src) in ENGINE_DEFAULTS["llama.cpp"].items()}
    coeffs["prefill_expert_vecdot_flops_per_weight"] = vecdot
    out = evaluate(arch, "llama.cpp", coeffs, memory_gib=24.0, usable_gib=None, kind="cpu", bandwidth_gbs=16.0,
                   tflops=0.07, bits_per_weight=16.0 if quant_float else 4.5, prompt_tokens=tokens,
                   cpu_float_weights=quant_float, cpu_repack=0.0 if quant_float else 1.0,
                   with_max_context=False)
    return float(out["prefill_s"])


def test_f16_experts_on_the_cpu_are_priced_on_the_dot_product_path():
    arch = synthetic.resolve_arch("qwen3-30b-a3b", SHAPE)
    routed = arch.params_expert * arch.experts_per_token / arch.num_experts
    # each prompt token multiplies the routed weights once, at `vecdot` operations per weight beyond the GEMM rate
    extra = _prefill_s(arch, 1.0, 2.0) - _prefill_s(arch, 1.0, 0.0)
    assert extra == pytest.approx(256 * routed * 2.0 / 0.07e12, rel=1e-9)
    # quantized (repacked) experts have their own mul_mat_id: no such term
    assert _prefill_s(arch, 0.0, 2.0) == pytest.approx(_prefill_s(arch, 0.0, 0.0), rel=1e-12)
    # a dense F16 model keeps llamafile's GEMM for every layer matrix
    dense = synthetic.resolve_arch("qwen2.5-0.5b", {"num_layers": 4})
    assert _prefill_s(dense, 1.0, 2.0) == pytest.approx(_prefill_s(dense, 1.0, 0.0), rel=1e-12)
    # the experts' FLOPs leave llamafile's share (prefill_f16_efficiency) for the repacked kernels' rate
    layer = arch.params_active - lm_head_params(arch)
    assert 0.0 < routed / layer < 1.0


def test_the_cpu_sweeps_measure_the_moe_shape_and_the_shipped_host_fitted_it():
    for name in ("host-calibration", "cpu-calibration"):
        configs = [c for c in load_sweep(name).configs if c["model"] == "qwen3-30b-a3b"]
        assert {c["quant"] for c in configs} == {"F16", "Q4_0"}, name
        assert all(dict(c["arch_overrides"]) == SHAPE for c in configs), name
    table = json.loads((ROOT / "calibration" / "coefficients.json").read_text(encoding="utf-8"))
    hosts = [entry for device, entry in table["engines"]["llama.cpp"]["devices"].items() if device.startswith("cpu-")
             and "prefill_expert_vecdot_flops_per_weight" in entry]
    assert hosts and all(h["prefill_expert_vecdot_flops_per_weight"]["identified"] for h in hosts)
    assert all(m.startswith("qwen3-30b-a3b[") for h in hosts for m in h["prefill_expert_vecdot_flops_per_weight"]["models"])
