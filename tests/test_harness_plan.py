"""Planning a run: a configuration the predictor says will not fit is replaced by the one it recommends."""

from __future__ import annotations

from harness.protocol import plan_config, prepare_config


def test_qwen72b_q4km_on_one_l4_is_measured_with_the_layers_that_fit():
    cfg = prepare_config({"model": "qwen2.5-72b", "quant": "Q4_K_M", "engine": "llama.cpp", "device": "l4",
                          "context": 8192, "prompt_tokens": [512], "gen_tokens": 32})
    plan = plan_config(cfg)
    assert plan.planned is not None
    assert plan.planned["verdict"] == "needs offload"
    assert plan.planned["config"]["context"] == 8192
    layers = plan.config["engine_options"]["n_gpu_layers"]
    assert 0 < layers < 80
    assert plan.config["offload_fraction"] == round(1 - layers / 80, 4)
    assert plan.prediction["fit"]["verdict"] in ("fits", "tight")
    assert any("needs offload" in m for m in plan.messages)


def test_a_config_that_fits_is_measured_as_asked():
    cfg = prepare_config({"model": "qwen2.5-7b", "quant": "Q4_K_M", "engine": "llama.cpp", "device": "h200-sxm",
                          "context": 8192, "prompt_tokens": [512], "gen_tokens": 32})
    plan = plan_config(cfg)
    assert plan.planned is None and plan.config == cfg
    assert plan.prediction["fit"]["verdict"] == "fits"


def test_an_outcome_that_contradicts_the_verdict_is_a_prediction_error():
    from harness.protocol import prediction_error

    assert prediction_error("oom", "fits")["kind"] == "oom_predicted_fits"
    assert prediction_error("ok", "does not fit")["kind"] == "ok_predicted_not_fit"
    assert prediction_error("ok", "needs offload")["kind"] == "ok_predicted_not_fit"
    assert prediction_error("ok", "fits") is None
    assert prediction_error("oom", "tight") is None


def test_the_stored_prediction_is_made_where_each_quantity_is_measured():
    # TTFT for the longest prompt; decode after the shortest prompt, halfway through the generated tokens,
    # which is where the harness measures it (a KV read at 256 tokens would be compared with one at 80).
    cfg = prepare_config({"model": "smollm2-135m", "quant": "Q4_0", "engine": "llama.cpp", "device": "h200-sxm",
                          "context": 1024, "prompt_tokens": [64, 256], "gen_tokens": 32})
    throughput = plan_config(cfg).prediction["throughput"]
    assert throughput["prompt_tokens"] == 256
    assert throughput["decode_context"] == 64 + 32 // 2


def test_a_synthetic_checkpoint_is_predicted_with_its_exact_size():
    # The synthetic GGUF follows llama-quantize's tensor types (tied embeddings in Q6_K/Q8_0 ...): for a
    # small model with a large vocabulary that is far from the catalogue's whole-file average width.
    from harness import synthetic

    cfg = prepare_config({"model": "qwen2.5-0.5b", "quant": "Q4_0", "engine": "llama.cpp", "device": "h200-sxm",
                          "weights": "synthetic", "context": 2048, "prompt_tokens": [64], "gen_tokens": 16})
    exact = synthetic.weights_bytes(synthetic.resolve_spec("qwen2.5-0.5b"), "Q4_0")
    weights_gib = plan_config(cfg).prediction["memory"]["weights_total_gib"]
    assert weights_gib == round(exact / 2**30, 3)
