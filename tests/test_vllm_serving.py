"""vLLM on a GPU: the weights it keeps on the device, and the KV pool and concurrency it sizes from what is left."""

from __future__ import annotations

import pytest

from benchcal.cli import main
from predictor import memory as mem
from predictor.errors import BenchcalError
from predictor.estimate import predict
from predictor.serving import DEFAULT_GPU_MEMORY_UTILIZATION

GIB = 2**30


def test_vllm_keeps_the_input_embedding_of_an_untied_model_on_the_gpu():
    vllm = predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, launch=False)
    arch = vllm.model
    assert arch.params_output  # untied: the embedding is a tensor of its own
    assert vllm.values["weights_bytes"] == pytest.approx(arch.params_total * 2, rel=1e-9)  # every weight, BF16
    llama = predict("llama-3.1-8b", "h100-sxm", "F16", 8192, coefficients=None, launch=False)
    embedding = arch.params_embedding * 2
    assert llama.values["weights_bytes"] == pytest.approx(arch.params_total * 2 - embedding, rel=1e-3)  # on the host (norms F32)


def test_the_kv_pool_is_what_vllms_share_of_the_device_leaves():
    est = predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, launch=False)
    s = est.serving
    assert s["gpu_memory_utilization"] == DEFAULT_GPU_MEMORY_UTILIZATION
    expected = 0.9 * est.device.memory_gib * GIB - est.values["weights_bytes"] - est.values["runtime_bytes"]
    assert s["kv_pool_gib"] == pytest.approx(expected / GIB, abs=1e-3)
    per_token = float(mem.kv_cache_bytes(est.model, 8192, 1, 2.0, "vllm")) / 8192  # 128 KiB: 32 x 8 x 128 x 2 x 2
    assert per_token == 32 * 8 * 128 * 2 * 2
    assert abs(s["kv_pool_tokens"] - expected / per_token) <= 16 and s["kv_pool_tokens"] % 16 == 0
    assert s["max_concurrent_sequences"] == int(expected // (per_token * 8192))
    half = predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, launch=False,
                   gpu_memory_utilization=0.5).serving
    assert half["kv_pool_gib"] < s["kv_pool_gib"] and half["gpu_memory_utilization"] == 0.5
    two = predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", device_count=2, coefficients=None,
                  launch=False).serving
    assert two["kv_pool_gib"] > s["kv_pool_gib"]  # per GPU: half the weights each


def test_serving_is_vllms_on_a_gpu_only_and_bad_utilization_is_refused(capsys, tmp_path):
    assert predict("llama-3.1-8b", "h100-sxm", "Q4_K_M", 8192, coefficients=None, launch=False).serving is None
    with pytest.raises(SystemExit) as refused:  # refused while the command line is parsed
        main(["predict", "--engine", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
              "--gpu-memory-utilization", "1.5"])
    assert refused.value.code == 2 and "--gpu-memory-utilization" in capsys.readouterr().err
    with pytest.raises(BenchcalError):
        predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, gpu_memory_utilization=1.5)
    out = tmp_path / "p.json"
    assert main(["predict", "--engine", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--format", "json",
                 "--gpu-memory-utilization", "0.8", "--output", str(out)]) == 0
    import json

    serving = json.loads(out.read_text())["serving"]
    assert serving["gpu_memory_utilization"] == 0.8 and serving["max_concurrent_sequences"] > 0
