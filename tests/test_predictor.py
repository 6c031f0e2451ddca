"""The analytical predictor: fit verdicts, the JSON contract, formulas and vectorized sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.coefficients import Coefficients
from predictor.devices import cpu_device, load_devices, resolve_device
from predictor.engines import ENGINES
from predictor.errors import BenchcalError
from predictor.estimate import GIB, predict
from predictor.grid import sweep
from predictor.models import resolve_model
from predictor.quants import resolve_quant

JSON_KEYS = [
    "model.id", "model.params_b", "model.active_params_b", "gpu.id", "gpu.name", "gpu.count", "gpu.usable_gib",
    "engine", "quant", "context", "batch", "kv_dtype", "memory.weights_gib", "memory.kv_cache_gib",
    "memory.runtime_gib", "memory.total_gib", "memory.offload_gib", "fit.verdict", "fit.headroom_gib",
    "fit.utilization", "fit.max_context", "throughput.decode_tok_s", "throughput.prefill_tok_s",
    "throughput.ttft_ms", "throughput.prompt_tokens", "calibration.status", "calibration.source",
    "launch.llama_cpp", "launch.vllm",
]


def _dig(d, dotted):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_qwen72b_q4km_8k_needs_offload_on_one_l4():
    est = predict("qwen2.5-72b", "l4", "Q4_K_M", 8192, coefficients=None)
    assert est.verdict == "needs offload"
    assert est.values["total_bytes"] > est.values["usable_bytes"]
    assert 0 < est.values["max_gpu_layers"] < est.model.num_layers


def test_qwen72b_q4km_8k_fits_an_h200():
    est = predict("qwen2.5-72b", "h200", "Q4_K_M", 8192, coefficients=None)
    assert est.verdict == "fits"
    assert est.to_dict()["fit"]["max_context"] == est.model.max_context
    # where no context fits on the device: null, not 0 (a 70B model on a 12 GB card)
    small = predict("llama-3.1-70b", "rtx-3060-12gb", "Q4_K_M", 4096)
    assert small.values["max_context"] == 0 and small.to_dict()["fit"]["max_context"] is None


def test_kv_cache_in_the_breakdown_is_exact_for_qwen72b():
    for ctx, gib in ((8192, 2.5), (32768, 10.0)):
        est = predict("qwen2.5-72b", "h200", "Q4_K_M", ctx, coefficients=None)
        assert est.values["kv_cache_bytes"] == 2 * 80 * 8 * 128 * ctx * 2
        assert est.values["kv_cache_bytes"] / GIB == gib


def test_predict_json_has_the_documented_keys():
    d = predict("qwen2.5-72b", "h200", "Q4_K_M", 32768, coefficients=None).to_dict()
    for key in JSON_KEYS:
        _dig(d, key)
    assert d["calibration"]["status"] == "default"
    assert d["model"]["params_b"] == pytest.approx(72.71, rel=0.005)


def test_weights_scale_with_bits_per_weight():
    # phi-4 (fused QKV) has no llama-quantize plan here: one average width per format.
    a = predict("phi-4", "h200", "Q8_0", 8192, coefficients=None).values["weights_total_bytes"]
    b = predict("phi-4", "h200", "Q4_0", 8192, coefficients=None).values["weights_total_bytes"]
    assert a / b == pytest.approx(8.5 / 4.5)


def test_offload_moves_layers_to_host_and_slows_decode():
    full = predict("qwen2.5-7b", "rtx-4090", "Q4_K_M", 8192, coefficients=None)
    half = predict("qwen2.5-7b", "rtx-4090", "Q4_K_M", 8192, offload_fraction=0.5, coefficients=None)
    assert half.values["offload_bytes"] > 0.4 * full.values["weights_total_bytes"]
    assert half.values["total_bytes"] < full.values["total_bytes"]
    assert half.values["decode_tok_s"] < full.values["decode_tok_s"]
    assert "-ngl 14" in half.launch["llama_cpp"]


def test_tensor_parallel_vllm_splits_bytes_and_adds_communication():
    one = predict("llama-3.1-70b", "h100-sxm", "FP8", 8192, "vllm", coefficients=None)
    two = predict("llama-3.1-70b", "h100-sxm", "FP8", 8192, "vllm", device_count=2, coefficients=None)
    assert two.values["decode_tok_s"] > one.values["decode_tok_s"]
    assert two.values["decode_tok_s"] < 2 * one.values["decode_tok_s"]
    assert "--tensor-parallel-size 2" in two.launch["vllm"]


def test_flash_attention_off_grows_the_compute_buffer_with_context():
    on = predict("qwen2.5-7b", "h100-sxm", "Q4_K_M", 32768, coefficients=None)
    off = predict("qwen2.5-7b", "h100-sxm", "Q4_K_M", 32768, flash_attn=False, coefficients=None)
    extra = off.values["runtime_bytes"] - on.values["runtime_bytes"]
    arch = resolve_model("qwen2.5-7b")
    hidden = 512 * 4 * arch.hidden_size
    # without flash attention the f32 scores phase (512 x 32768 x 28 heads) replaces the logits phase
    assert extra == pytest.approx(512 * 32768 * 28 * 4 + 6.5 * hidden - (512 * 4 * arch.vocab_size + 3 * hidden))


def test_without_flash_attention_llama_cpp_reads_the_kv_once_per_query_head():
    # Llama-3-8B: 32 query heads share 8 K/V heads; the non-flash-attention path of llama.cpp multiplies
    # head by head, so each cached K/V row is read 4 times per step. Flash attention and vLLM read it once.
    # The first read runs at decode_kv_efficiency; the 3 re-reads cost decode_kv_reread each (1: all from DRAM
    # at peak; less where the cache holds the rows between query heads).
    arch = resolve_model("llama-3-8b")
    kv = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 2 * 4096  # f16 K and V at 4096 tokens
    bw = resolve_device("rtx-4090").bandwidth_gbs * 1e9
    for reread in (1.0, 0.5):
        coeffs = {"decode_fixed_ms": 0.0, "decode_fixed_per_layer_us": 0.0, "decode_bw_efficiency": 1e200,
                  "decode_kv_efficiency": 1.0, "decode_kv_reread": reread}
        table = Coefficients({"engines": {e: {"default": dict(coeffs)} for e in ENGINES}})
        for engine, quant, flash, reads in (("llama.cpp", "Q4_K_M", False, 1 + 3 * reread),
                                            ("llama.cpp", "Q4_K_M", True, 1), ("vllm", "BF16", False, 1)):
            est = predict(arch, "rtx-4090", quant, 8192, engine, prompt_tokens=4096, flash_attn=flash,
                          coefficients=table, launch=False)
            assert est.values["decode_step_s"] == pytest.approx(reads * kv / bw, rel=1e-9), (engine, flash, reread)


def test_unified_memory_gpus_and_the_cpu_pay_for_unpacking_quantized_weights():
    # Apple GPUs (no matrix units; FP16 at the ALU rate) and the CPU unpack the quantized weights of the decode
    # matvec at a rate close to their bandwidth: decode_dequant_flops_per_byte operations per quantized byte at
    # the listed (CPU: measured) FLOPS. Not for 16-bit weights, not on discrete GPUs (their listed peak is the
    # tensor cores'), and not where the device has no FLOPS figure.
    from predictor.devices import cpu_device

    arch = resolve_model("llama-3-8b")
    coeffs = {"decode_fixed_ms": 0.0, "decode_fixed_per_layer_us": 0.0, "decode_bw_efficiency": 1e200,
              "decode_kv_efficiency": 1e200, "decode_dequant_flops_per_byte": 12.0, "host_bw_efficiency": 1e200}
    table = Coefficients({"engines": {"llama.cpp": {"default": dict(coeffs)}}})

    def est(device, quant):
        return predict(arch, device, quant, 4096, prompt_tokens=512, coefficients=table, launch=False).values

    m1 = resolve_device("macbook-pro-m1-max-64gb")
    q4 = est(m1.id, "Q4_K_M")
    # the step's device-resident weights: all but the untied input embedding
    streamed = q4["weights_total_bytes"] - arch.params_embedding * q4["weights_total_bytes"] / arch.params_total
    assert q4["decode_step_s"] == pytest.approx(streamed * 12.0 / (m1.fp16_tflops * 1e12), rel=1e-9)
    assert est(m1.id, "F16")["decode_step_s"] == pytest.approx(0.0, abs=1e-12)
    assert est("rtx-4090", "Q4_K_M")["decode_step_s"] == pytest.approx(0.0, abs=1e-12)
    import dataclasses

    no_flops = dataclasses.replace(resolve_device("macbook-pro-m3-max-128gb"), fp16_tflops=None)
    assert est(no_flops, "Q4_K_M")["decode_step_s"] == pytest.approx(0.0, abs=1e-12)
    cpu = cpu_device(bandwidth_gbs=20.0, tflops=0.1, memory_gib=24.0)
    q8 = est(cpu, "Q8_0")
    assert q8["decode_step_s"] == pytest.approx(
        (q8["weights_total_bytes"] - arch.params_embedding * q8["weights_total_bytes"] / arch.params_total)
        * 12.0 / 0.1e12, rel=1e-9)
    assert est(cpu, "F16")["decode_step_s"] == pytest.approx(0.0, abs=1e-12)


def prefill_only(device_id: str, bits_per_weight: float, term: str, value: float, **options) -> float:
    """Prefill seconds of Llama-3-8B (2048-token prompt) with every term neutral but ``term``."""
    from predictor.estimate import evaluate
    from predictor.scenario import device_kwargs
    coeffs = dict(Coefficients().lookup("llama.cpp", "none", "none").values)
    coeffs.update({"prefill_fixed_ms": 0.0, "decode_bw_efficiency": 1e200, "prefill_compute_efficiency": 1e200,
                   "prefill_scores_efficiency": 1e200, "prefill_attn_efficiency": 1e200, term: value})
    return float(evaluate(resolve_model("llama-3-8b"), "llama.cpp", coeffs, bits_per_weight=bits_per_weight,
                          **device_kwargs(resolve_device(device_id), "llama.cpp"), context=4096, prompt_tokens=2048,
                          n_ubatch=512, with_max_context=False, **options)["prefill_s"])


def test_old_cuda_builds_pay_per_ubatch_for_dequantizing_weights_to_fp16():
    # Before llama.cpp PR #8075 a CUDA build dequantized each quantized weight matrix into an FP16 buffer
    # for cuBLAS once per ubatch: prefill_dequant_bytes_per_weight of traffic per weight at the bandwidth.
    arch, gpu, term = resolve_model("llama-3-8b"), resolve_device("rtx-4090"), "prefill_dequant_bytes_per_weight"
    layer_weights = arch.params_total - arch.params_non_layer
    assert prefill_only("rtx-4090", 4.89, term, 3.0, cublas_dequant=True) == pytest.approx(
        4 * layer_weights * 3.0 / (gpu.bandwidth_gbs * 1e9), rel=1e-9)  # 2048 tokens: 4 ubatches
    assert prefill_only("rtx-4090", 4.89, term, 3.0) == pytest.approx(0.0)  # current builds: MMQ
    assert prefill_only("rtx-4090", 16.0, term, 3.0, cublas_dequant=True) == pytest.approx(0.0)


def test_unified_memory_gpus_unpack_quantized_weights_for_every_prompt_token():
    arch, mac, term = resolve_model("llama-3-8b"), resolve_device("mac-studio-m2-ultra-192gb"), \
        "prefill_unpack_flops_per_weight"
    assert prefill_only(mac.id, 4.89, term, 0.5) == pytest.approx(
        2048 * arch.params_active * 0.5 / (mac.fp16_tflops * 1e12), rel=1e-9)
    assert prefill_only(mac.id, 16.0, term, 0.5) == pytest.approx(0.0)
    assert prefill_only("rtx-4090", 4.89, term, 0.5) == pytest.approx(0.0)


def test_the_cpu_generic_matmul_path_costs_more_per_token_than_the_repacked_kernels():
    # llama.cpp repacks Q4_0 / Q4_K / IQ4_NL for its CPU GEMM kernels; Q8_0 and F16 take the generic path,
    # prefill_generic_flops_per_weight operations per layer weight and token at the measured FLOPS.
    from predictor.devices import cpu_device
    from predictor.estimate import evaluate
    from predictor.scenario import device_kwargs
    from predictor.throughput import lm_head_params

    arch, cpu = resolve_model("llama-3-8b"), cpu_device(bandwidth_gbs=20.0, tflops=0.1, memory_gib=64.0)
    coeffs = dict(Coefficients().lookup("llama.cpp", "none", "none").values)
    coeffs.update({"prefill_fixed_ms": 0.0, "decode_bw_efficiency": 1e200, "prefill_compute_efficiency": 1e200,
                   "prefill_scores_efficiency": 1e200, "prefill_attn_efficiency": 1e200,
                   "prefill_generic_flops_per_weight": 2.0})

    def prefill(bits, repacked, engine="llama.cpp", **device):
        return float(evaluate(arch, engine, coeffs, bits_per_weight=bits, **(device or device_kwargs(cpu, engine)),
                              context=4096, prompt_tokens=512, cpu_repack=repacked,
                              with_max_context=False)["prefill_s"])

    expected = 512 * (arch.params_active - lm_head_params(arch)) * 2.0 / 0.1e12
    assert prefill(8.5, False) == pytest.approx(expected, rel=1e-9)  # Q8_0
    assert prefill(16.0, False) == pytest.approx(expected, rel=1e-9)  # F16
    assert prefill(4.5, True) == pytest.approx(0.0, abs=1e-12)  # Q4_0, repacked
    assert prefill(8.5, False, **device_kwargs(resolve_device("rtx-4090"), "llama.cpp")) == pytest.approx(0.0, abs=1e-12)


def test_a_negative_fixed_offset_never_makes_the_fixed_time_negative():
    coeffs = {"decode_fixed_ms": -5.0, "decode_fixed_per_layer_us": 100.0, "decode_bw_efficiency": 1e200,
              "decode_kv_efficiency": 1e200}
    table = Coefficients({"engines": {"llama.cpp": {"default": dict(coeffs)}}})
    shallow = predict("llama-3.2-1b", "h200", "Q4_K_M", 4096, coefficients=table, launch=False)  # 16 layers
    deep = predict("llama-3-70b", "h200", "Q4_K_M", 4096, coefficients=table, launch=False)  # 80 layers
    assert shallow.values["decode_step_s"] == pytest.approx(0.0, abs=1e-12)
    assert deep.values["decode_step_s"] == pytest.approx(-5e-3 + 80 * 100e-6, rel=1e-9)


def test_llama_cpp_prefill_runs_at_the_fp16_accumulate_rate_on_geforce_cards():
    geforce, pro = resolve_device("rtx-4090"), resolve_device("rtx-6000-ada")
    assert geforce.matmul_tflops("llama.cpp") == pytest.approx(2 * geforce.fp16_tflops)
    assert geforce.matmul_tflops("vllm") == geforce.fp16_tflops
    assert pro.matmul_tflops("llama.cpp") == pro.matmul_tflops("vllm") == pro.fp16_tflops
    slow = predict("llama-3-8b", "rtx-4090", "F16", 8192, "llama.cpp", prompt_tokens=4096, coefficients=None)
    assert slow.to_dict()["gpu"]["matmul_tflops"] == pytest.approx(330.4)


def test_llama_cpp_attention_without_flash_attention_moves_the_scores_through_memory():
    # Without -fa the f32 scores (heads x n^2/2 for a causal prompt) are written to memory: their time
    # follows bandwidth, not FLOPS. With flash attention the n^2 term is FLOPs at the attention efficiency.
    from predictor import throughput as tp
    arch = resolve_model("llama-3-8b")
    off = 1e200
    coeffs = {"decode_bw_efficiency": off, "prefill_compute_efficiency": off, "prefill_fixed_ms": 0.0,
              "pcie_gbs": 25.0, "prefill_attn_efficiency": 0.5, "prefill_scores_efficiency": 0.25}
    kwargs = {"prompt_tokens": 4096, "n_ubatch": 512, "device_weight_bytes": 0.0, "host_weight_bytes": 0.0,
              "bandwidth_gbs": 1000.0, "tflops": 100.0}
    scores = arch.num_attention_heads * arch.num_layers * 4096 * 4096 / 2 * 4  # f32 bytes
    memory = tp.prefill_seconds(arch, coeffs, scores_in_memory=True, **kwargs)
    assert float(memory) == pytest.approx(scores / (0.25 * 1000e9))
    flash = tp.prefill_seconds(arch, coeffs, scores_in_memory=False, **kwargs)
    assert float(flash) == pytest.approx(float(tp.prefill_attention_flops(arch, 4096)) / (0.5 * 100e12))


def test_moe_decode_reads_active_experts_only():
    est = predict("qwen3-30b-a3b", "rtx-4090", "Q4_K_M", 4096, coefficients=None)
    dense = predict("qwen3-32b", "rtx-4090", "Q4_K_M", 4096, coefficients=None)
    assert est.values["decode_tok_s"] > 4 * dense.values["decode_tok_s"]


def test_mxfp4_experts_keep_their_width_and_the_rest_of_a_file_is_the_dense_part():
    # gpt-oss-20b: MXFP4 experts (4.25 bits); the other tensors take the rest of the file. ggml-org's GGUF
    # (12.1e9 bytes) leaves about 8.5 bits per non-expert weight (Q8_0), the checkpoint's BF16 gives 16.
    from predictor import memory as mem
    from predictor import throughput as tp
    arch = resolve_model("gpt-oss-20b")
    expert, other = mem.bytes_per_param(arch, 12.1e9, 4.25, 16.0)
    assert float(expert) == pytest.approx(4.25 / 8)
    assert float(other) * 8 == pytest.approx(8.5, abs=0.5)
    full = mem.weights_bytes(arch, 4.25, 16.0)
    assert [float(x) * 8 for x in mem.bytes_per_param(arch, full, 4.25, 16.0)] == pytest.approx([4.25, 16.0])
    average = 12.1e9 / arch.params_total
    step = tp.decode_weight_bytes_per_step(arch, 12.1e9, 1, 4.25, 16.0)
    assert float(step) > 1.15 * arch.params_active * average  # the dense part is read at its wider width


def test_vllm_launch_command_reserves_the_share_its_kv_pool_was_predicted_at():
    # the pool the prediction gives (vLLM's default share, or the one asked for) is the pool the command starts
    def util(est):
        return float(est.launch["vllm"].split("--gpu-memory-utilization ")[1].split()[0])

    est = predict("qwen2.5-7b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None)
    assert util(est) == est.serving["gpu_memory_utilization"] == 0.92
    asked = predict("qwen2.5-7b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, gpu_memory_utilization=0.5)
    assert util(asked) == 0.5 and asked.serving["gpu_memory_utilization"] == 0.5
    from predictor.launch import gpu_memory_utilization

    need = est.values["total_bytes"] / (est.device.memory_gib * GIB)  # the fallback where no pool is predicted
    assert need < gpu_memory_utilization(est.values["total_bytes"], 1, est.device.memory_gib) <= need + 0.04


def test_cpu_device_uses_the_given_bandwidth():
    slow = cpu_device(bandwidth_gbs=10.0, tflops=0.2, memory_gib=24.0)
    fast = cpu_device(bandwidth_gbs=40.0, tflops=0.2, memory_gib=24.0)
    a = predict("smollm2-135m", slow, "Q8_0", 2048, coefficients=None)
    b = predict("smollm2-135m", fast, "Q8_0", 2048, coefficients=None)
    assert b.values["decode_tok_s"] > 3 * a.values["decode_tok_s"]
    assert a.values["offload_bytes"] == 0


def test_sweep_matches_predict_cell_by_cell():
    arch = resolve_model("qwen2.5-72b")
    devices = [resolve_device(x) for x in ("l4", "h200", "rtx-4090")]
    quants = [resolve_quant(x, "llama.cpp") for x in ("Q4_K_M", "Q8_0")]
    out = sweep(arch, "llama.cpp", devices, quants, [4096, 32768], [1, 4], table=Coefficients())
    for i, d in enumerate(devices):
        for j, q in enumerate(quants):
            est = predict(arch, d, q.id, 32768, batch=4, coefficients=None)
            assert out["total_bytes"][i, j, 1, 1] == pytest.approx(est.values["total_bytes"])
            assert out["decode_tok_s"][i, j, 1, 1] == pytest.approx(est.values["decode_tok_s"])
            assert out["verdict"][i, j, 1, 1] == est.values["verdict"]


def test_sweep_sizes_and_splits_gpt_oss_f16_as_predict_does():
    # MXFP4 experts beside 16-bit other weights: the sweep behind leaderboard/matrix/recommend agrees with predict.
    arch = resolve_model("gpt-oss-20b")
    devices = [resolve_device(x) for x in ("rtx-4090", "h100-sxm")]
    quants = [resolve_quant(x, "llama.cpp") for x in ("F16", "MXFP4", "Q4_K_M")]
    out = sweep(arch, "llama.cpp", devices, quants, [8192], [1], table=Coefficients())
    for i, d in enumerate(devices):
        for j, q in enumerate(quants):
            est = predict(arch, d, q.id, 8192, coefficients=None)
            assert out["total_bytes"][i, j, 0, 0] == pytest.approx(est.values["total_bytes"])
            assert out["decode_tok_s"][i, j, 0, 0] == pytest.approx(est.values["decode_tok_s"])


def test_sweep_over_every_device_gives_finite_numbers_where_the_catalogue_has_figures():
    arch = resolve_model("deepseek-v3")
    devices = [d for d in load_devices() if "llama.cpp" in d.engines and d.kind != "cpu"]
    out = sweep(arch, "llama.cpp", devices, [resolve_quant("Q4_K_M")], [8192, 65536], [1, 8])
    for key in ("total_bytes", "max_context"):
        assert np.isfinite(out[key]).all()
    known = np.array([d.bandwidth_gbs is not None and d.fp16_tflops is not None for d in devices])
    for key in ("decode_tok_s", "prefill_tok_s", "ttft_s"):
        assert np.isfinite(out[key][known]).all()


def test_calibrated_coefficients_override_defaults_and_say_so(tmp_path):
    path = tmp_path / "coefficients.json"
    path.write_text('{"schema_version": 1, "source": "test table", "engines": {"llama.cpp": {"devices": '
                    '{"h200-sxm": {"decode_bw_efficiency": {"value": 0.5, "uncertainty": 0.05}}}}}}')
    default = predict("qwen2.5-72b", "h200", "Q4_K_M", 8192, coefficients=None)
    cal = predict("qwen2.5-72b", "h200", "Q4_K_M", 8192, coefficients=path)
    assert cal.to_dict()["calibration"]["status"] == "calibrated"
    assert cal.to_dict()["calibration"]["scope"] == "device:h200-sxm"
    assert cal.values["decode_tok_s"] < default.values["decode_tok_s"]
    other = predict("qwen2.5-72b", "h100-sxm", "Q4_K_M", 8192, coefficients=path)
    assert other.to_dict()["calibration"]["status"] == "default"


def test_a_gguf_model_uses_the_exact_sum_of_its_tensor_bytes(tmp_path):
    from test_architecture import write_tiny_llama_gguf

    path = tmp_path / "tiny.gguf"
    totals = write_tiny_llama_gguf(path)
    arch = resolve_model(str(path))
    est = predict(arch, "h200", None, 256, coefficients=None)
    assert est.quant.id == arch.weights_quant
    assert est.values["weights_total_bytes"] == arch.weights_bytes_exact
    assert est.to_dict()["memory"]["weights_exact"] is True
    assert arch.weights_bytes_exact == totals["bytes"]


def test_low_bit_k_quants_cost_unpacking_work_on_a_discrete_gpu():
    from predictor.coefficients import Coefficients
    from predictor.estimate import Scenario, predict_scenario
    from predictor.models import resolve_model
    from predictor.weights import low_bit_kquant_share

    llama = resolve_model("llama-3.1-8b")
    assert low_bit_kquant_share(llama, "Q4_K_M") == 0.0 and low_bit_kquant_share(llama, "F16") == 0.0
    assert 0.9 < low_bit_kquant_share(llama, "Q2_K") <= 1.0  # llama-quantize keeps some tensors wider
    assert 0.5 < low_bit_kquant_share(llama, "Q3_K_M") < 0.8  # Q3_K_M: attn_v / ffn_down in Q4_K / Q5_K
    assert low_bit_kquant_share(resolve_model("pythia-2.8b"), "Q2_K") == 1.0  # no plan: the format as a whole

    def decode(quant, term, gpu="rtx-4090"):
        table = Coefficients({"schema_version": 1, "engines": {"llama.cpp": {"default": {
            "decode_kquant_flops_per_weight": {"value": term, "identified": True}}}}})
        return predict_scenario(Scenario(llama, gpu, quant=quant, prompt_tokens=512), table).values["decode_step_s"]

    extra = decode("Q2_K", 60.0) - decode("Q2_K", 0.0)
    params = llama.params_active
    assert extra == pytest.approx(params * low_bit_kquant_share(llama, "Q2_K") * 60.0 / 330e12, rel=0.2)
    assert decode("Q4_K_M", 60.0) == decode("Q4_K_M", 0.0)  # only the low-bit K-quants
    assert decode("Q2_K", 60.0, "mac-studio-m2-ultra-192gb") == decode("Q2_K", 0.0, "mac-studio-m2-ultra-192gb")


def test_a_mixture_of_experts_layer_costs_its_own_fixed_time_per_decode_step():
    def table(us: float) -> Coefficients:
        return Coefficients({"engines": {"llama.cpp": {"default": {
            "decode_moe_per_layer_us": {"value": us, "identified": True}}}}})

    for arch in (resolve_model("gpt-oss-20b"), resolve_model("llama-3.1-8b")):  # 24 MoE layers; none
        without = predict(arch, "rtx-4090", "Q4_K_M", 4096, "llama.cpp", coefficients=table(0.0), launch=False)
        with_term = predict(arch, "rtx-4090", "Q4_K_M", 4096, "llama.cpp", coefficients=table(50.0), launch=False)
        step = float(with_term.values["decode_step_s"]) - float(without.values["decode_step_s"])
        assert step == pytest.approx(50e-6 * arch.num_moe_layers, rel=1e-6, abs=1e-12), arch.id


def test_a_prompt_after_tokens_already_in_the_cache_attends_to_them_too():
    # n tokens after d in the cache: each attends to the positions before it, n x d + n^2/2 in all; a sliding
    # window's layers to at most W each
    from predictor import throughput as tp
    llama = resolve_model("llama-3.1-8b")
    per_position = llama.attn_flops_per_position_full
    assert float(tp.prefill_attention_flops(llama, 512)) == pytest.approx(per_position * 512 * 512 / 2)
    assert float(tp.prefill_attention_flops(llama, 512, 0)) == float(tp.prefill_attention_flops(llama, 512))
    assert float(tp.prefill_attention_flops(llama, 512, 32768)) == pytest.approx(
        per_position * (512 * 32768 + 512 * 512 / 2))
    gemma = resolve_model("gemma-3-4b")  # five of every six layers see the last 1,024 positions only
    window = gemma.attn_flops_per_position_window * gemma.sliding_window * 512
    deep = float(tp.prefill_attention_flops(gemma, 512, 65536)) - gemma.attn_flops_per_position_full * (
        512 * 65536 + 512 * 512 / 2)
    assert deep == pytest.approx(window)
    # the prediction: a slower prompt, and decode after it at depth + prompt tokens of context
    empty = predict("llama-3.1-8b", "rtx-4090", "Q4_K_M", 40960, prompt_tokens=512, coefficients=None, launch=False)
    late = predict("llama-3.1-8b", "rtx-4090", "Q4_K_M", 40960, prompt_tokens=512, prompt_depth=32768,
                   coefficients=None, launch=False)
    assert late.values["ttft_s"] > empty.values["ttft_s"] and late.values["decode_tok_s"] < empty.values["decode_tok_s"]
    assert late.to_dict()["throughput"]["decode_context"] == 33280 and late.to_dict()["throughput"]["prompt_depth"] == 32768
    with pytest.raises(BenchcalError, match="do not fit a context"):
        predict("llama-3.1-8b", "rtx-4090", "Q4_K_M", 4096, prompt_tokens=512, prompt_depth=4000, launch=False)


def test_a_llama_bench_row_at_depth_is_fitted_as_predict_describes_it():
    # the DGX Spark's Qwen2.5-7B pp2048 @ d16384 (llama.cpp's own benches): the calibration's prediction of the
    # row is predict's for a 2048-token prompt after 16,384 cached tokens
    from calibration.dataset import load_dataset
    from calibration.dataset import predict as predict_rows
    from predictor.coefficients import default_coefficients

    dataset = load_dataset(["runs"])
    rows = dataset.blocks["prefill"].meta
    i = int(np.flatnonzero(((rows["device_id"] == "dgx-spark") & (rows["model_key"] == "qwen2.5-7b")
                            & (rows["prompt_depth"] == 16384)).to_numpy())[0])
    row = rows.iloc[i]
    assert not isinstance(row["exclude_reason"], str)
    est = predict("qwen2.5-7b", "dgx-spark", "Q8_0", int(row["context"]), prompt_tokens=2048, prompt_depth=16384,
                  n_ubatch=int(row["n_ubatch"]), flash_attn=True, engine_build=int(str(row["engine_version"]).split()[2]),
                  launch=False)
    assert predict_rows(dataset, default_coefficients())["prefill"][i] == pytest.approx(est.values["prefill_s"], rel=0.02)
