"""One scenario object: built from a run configuration or the command line, translated once into the model's inputs."""

from __future__ import annotations

import dataclasses

import pytest

from predictor.estimate import predict, predict_scenario
from predictor.scenario import Scenario, scenario_inputs


def test_a_scenario_is_frozen_and_replace_gives_a_copy():
    s = Scenario("llama-3-8b", "rtx-4090", quant="Q4_K_M", context=4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.context = 8192  # type: ignore[misc]
    t = s.replace(context=8192, flash_attn=False)
    assert (s.context, s.flash_attn) == (4096, True) and (t.context, t.flash_attn, t.quant) == (8192, False, "Q4_K_M")


def test_predict_is_predict_scenario_of_the_scenario_its_arguments_describe():
    args = dict(prompt_tokens=1024, batch=2, kv_dtype="q8_0", flash_attn=True, n_ubatch=256)
    by_args = predict("qwen2.5-7b", "rtx-4090", "Q5_K_M", 16384, "llama.cpp", coefficients=None, **args).to_dict()
    scenario = Scenario("qwen2.5-7b", "rtx-4090", quant="Q5_K_M", context=16384, **args)
    assert predict_scenario(scenario, None).to_dict() == by_args


def test_from_config_reads_a_run_configuration_as_the_harness_stores_it():
    config = {"model": "qwen2.5-0.5b", "engine": "llama.cpp", "device": "rtx-4090", "quant": "Q8_0", "context": 2048,
              "prompt_tokens": [64, 512], "batch": 1, "kv_dtype": "f16", "device_count": 1, "offload_fraction": 0.25,
              "engine_options": {"flash_attn": True, "n_ubatch": 128, "n_gpu_layers": 18}}
    s = Scenario.from_config(config, host={"bandwidth_gbs": 40.0, "memory_gib": 32.0})
    assert (s.model, s.device, s.quant, s.context, s.prompt_tokens) == ("qwen2.5-0.5b", "rtx-4090", "Q8_0", 2048, 512)
    assert (s.flash_attn, s.n_ubatch, s.offload_fraction) == (True, 128, 0.25)
    assert (s.host_bandwidth_gbs, s.host_memory_gib) == (40.0, 32.0)
    assert Scenario.from_config(config, prompt_tokens=64).prompt_tokens == 64
    # flash attention is off unless the run turned it on, as llama.cpp's default was
    assert not Scenario.from_config({**config, "engine_options": {}}).flash_attn


def test_from_config_reads_vllms_batch_limits_and_device_share_as_vllm_serve_takes_them():
    # a vLLM run (or an imported vLLM log) keeps them in engine_options; the KV pool is sized from them
    config = {"model": "llama-3.1-8b", "engine": "vllm", "device": "a100-sxm-40gb", "quant": "BF16", "context": 8192,
              "engine_options": {"gpu_memory_utilization": 0.5, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
                                 "enforce_eager": True, "sampler": "flashinfer"}}
    s = Scenario.from_config(config, prompt_tokens=64)
    assert (s.gpu_memory_utilization, s.max_num_seqs, s.max_num_batched_tokens) == (0.5, 64, 8192)
    assert s.enforce_eager and s.flashinfer_sampler
    defaults = Scenario.from_config({**config, "engine_options": {}})
    assert (defaults.gpu_memory_utilization, defaults.max_num_seqs, defaults.max_num_batched_tokens) == (None,) * 3
    pools = [predict_scenario(x, None, launch=False).serving["kv_pool_gib"] for x in (s, s.replace(
        gpu_memory_utilization=0.9))]
    assert pools[1] > pools[0]


def test_the_inputs_a_prediction_uses_are_the_inputs_the_calibration_fits_against():
    # calibration.features builds each run's scenario and asks scenario_inputs, as predict_scenario does
    from calibration.features import row_inputs

    row = {"engine": "llama.cpp", "model": "llama-3-8b", "device": "rtx-4090", "quant": "Q4_K_M", "kv_dtype": "f16",
           "context": 4096.0, "batch": 1.0, "device_count": 1.0, "offload_fraction": 0.0, "flash_attn": True,
           "n_ubatch": 512.0, "weights_bytes": None, "host_bandwidth_gbs": None, "host_memory_gib": None}
    fitted = row_inputs(row)
    predicted = scenario_inputs(Scenario("llama-3-8b", "rtx-4090", quant="Q4_K_M", kv_dtype="f16", context=4096)).kwargs
    for key in ("bits_per_weight", "exact_weights_bytes", "kv_bytes_per_element", "bandwidth_gbs", "tflops",
                "memory_gib", "host_bandwidth_gbs", "host_memory_gib", "cpu_repack", "n_ubatch", "context"):
        assert fitted[key] == pytest.approx(predicted[key], nan_ok=True), key


def test_the_grid_takes_a_scenario_whose_device_quant_context_and_batch_are_its_axes():
    from predictor.devices import resolve_device
    from predictor.grid import sweep, sweep_scenario
    from predictor.models import resolve_model
    from predictor.quants import resolve_quant

    arch, devices = resolve_model("llama-3-8b"), [resolve_device("rtx-4090"), resolve_device("l4")]
    quants = [resolve_quant("Q4_K_M", "llama.cpp"), resolve_quant("Q8_0", "llama.cpp")]
    base = Scenario(arch, kv_dtype="q8_0", prompt_tokens=1024, flash_attn=True, n_ubatch=256)
    by_scenario = sweep_scenario(base, devices, quants, [4096, 8192], [1, 4])
    direct = sweep(arch, "llama.cpp", devices, quants, [4096, 8192], [1, 4], kv_bytes_per_element=34 / 32,
                   prompt_tokens=1024, flash_attn=True, n_ubatch=256)
    for key in ("decode_tok_s", "total_bytes", "ttft_s"):
        assert (by_scenario[key] == direct[key]).all(), key
    # one point of the grid is the prediction of that scenario
    one = predict_scenario(base.replace(device=devices[1], quant="Q8_0", context=8192, batch=4), None)
    assert one.values["decode_tok_s"] == pytest.approx(float(by_scenario["decode_tok_s"][1, 1, 1, 1]), rel=1e-9)
