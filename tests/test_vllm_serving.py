"""vLLM on a GPU and on a CPU: the weights it keeps on the device, and the KV pool and concurrency it sizes from
what is left."""

from __future__ import annotations

import pytest

from benchcal.cli import main
from predictor import memory as mem
from predictor.errors import BenchcalError
from predictor.estimate import predict
from predictor.memory import VLLM_GPU_MEMORY_UTILIZATION as DEFAULT_GPU_MEMORY_UTILIZATION

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
    assert s["gpu_memory_utilization"] == DEFAULT_GPU_MEMORY_UTILIZATION == 0.92  # vllm serve's default (0.32.0)
    c = est.coefficients
    profiled = est.values["runtime_bytes"] - c["runtime_fixed_gib"] * GIB  # the context predates the profile run
    total = est.device.cuda_total_gib * GIB  # what the driver reports: 79.18 GiB in llm-d's H100 logs
    assert c["vllm_visible_memory_share"] * est.device.memory_gib < est.device.cuda_total_gib  # the fallback
    expected = 0.92 * total - est.values["weights_bytes"] - profiled
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


def test_serving_is_vllms_only_and_bad_utilization_is_refused(capsys, tmp_path):
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


def test_predict_takes_the_sampler_the_profile_run_warms_up(capsys, tmp_path):
    import json

    pools = {}
    for sampler in ("pytorch", "flashinfer"):
        out = tmp_path / f"{sampler}.json"
        assert main(["predict", "--engine", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--quant", "BF16",
                     "--format", "json", "--vllm-sampler", sampler, "--defaults", "--output", str(out)]) == 0
        pools[sampler] = json.loads(out.read_text())["serving"]
    assert pools["pytorch"]["sampler"] == "pytorch" and "sort buffers" in pools["pytorch"]["formula"]
    assert pools["flashinfer"]["sampler"] == "flashinfer" and "no sort buffers" in pools["flashinfer"]["formula"]
    # FlashInfer's kernel sorts nothing: the profile's peak is the larger of the forward pass and a sampler warm-up
    # without the sorting sampler's logits-sized buffers (max_num_seqs, 1,024 on an H100, x the vocabulary x 4 bytes)
    est = predict("llama-3.1-8b", "h100-sxm", "BF16", 8192, "vllm", coefficients=None, launch=False)
    copies, arch = est.coefficients["vllm_sampler_copies"], est.model
    sorting = mem.vllm_sampler_bytes(arch, 8192, 1024, copies)
    assert sorting > mem.vllm_forward_bytes(arch, 8192)  # the sorting sampler sets the peak ...
    fast = max(mem.vllm_forward_bytes(arch, 8192), mem.vllm_sampler_bytes(arch, 8192, 1024))  # ... else the forward
    assert pools["flashinfer"]["kv_pool_gib"] == pytest.approx(pools["pytorch"]["kv_pool_gib"] + (sorting - fast) / GIB,
                                                               abs=0.002)
    with pytest.raises(SystemExit) as refused:
        main(["predict", "--engine", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--vllm-sampler", "topk"])
    assert refused.value.code == 2 and "--vllm-sampler" in capsys.readouterr().err


def test_on_a_cpu_the_pool_is_vllms_share_of_the_memory_node_less_what_its_worker_holds():
    import math

    from predictor.devices import cpu_device
    from predictor.estimate import predict_scenario
    from predictor.scenario import Scenario

    host = cpu_device(bandwidth_gbs=20.0, tflops=0.5, memory_gib=23.0, memory_node_gib=11.34)
    est = predict_scenario(Scenario("qwen2.5-0.5b", host, engine="vllm", quant="BF16", context=1024,
                                    prompt_tokens=64, gpu_memory_utilization=0.4), None, launch=False)
    s = est.serving
    worker = est.coefficients["vllm_cpu_worker_gib"]
    expected = math.ceil(0.4 * 11.34 * GIB) - est.values["weights_bytes"] - worker * GIB  # the node, not the host
    assert s["kv_pool_gib"] == pytest.approx(expected / GIB, abs=1e-3) and s["memory_node_gib"] == 11.34
    assert s["kv_pool_tokens"] % 128 == 0  # the CPU backend's 128-token blocks
    one_node = predict_scenario(Scenario("qwen2.5-0.5b", cpu_device(20.0, 0.5, 23.0), engine="vllm", quant="BF16",
                                         context=1024, prompt_tokens=64, gpu_memory_utilization=0.4),
                                None, launch=False).serving
    assert one_node["memory_node_gib"] == 23.0 and one_node["kv_pool_gib"] > s["kv_pool_gib"]


def test_the_memory_node_is_the_one_the_first_allowed_cpu_is_on(tmp_path, monkeypatch):
    import os

    from harness.hostbench import memory_node_gib

    (tmp_path / "cpu" / "cpu3" / "node1").mkdir(parents=True)
    (tmp_path / "node" / "node1").mkdir(parents=True)
    (tmp_path / "node" / "node1" / "meminfo").write_text("Node 1 MemTotal:       11888376 kB\nNode 1 MemFree: 1 kB\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5})
    assert memory_node_gib(str(tmp_path)) == pytest.approx(11888376 / 2**20)
    assert memory_node_gib(str(tmp_path / "missing")) is None


def test_the_predicted_cpu_pool_is_within_5_percent_of_what_vllm_logged():
    from pathlib import Path

    from calibration.dataset import load_dataset
    from calibration.kvpool import kv_pool_checks

    checks = kv_pool_checks(load_dataset(Path(__file__).parent / "data" / "vllm" / "kv-pool"))
    assert sorted(c["model"] for c in checks) == ["llama-3.2-1b", "qwen2.5-0.5b", "smollm2-135m"]
    for c in checks:  # the worker figure fitted on the host's other runs: the pool of a run it never saw
        assert abs(c["held_out_error"]) <= 0.05 or abs(c["held_out_gib"] - c["logged_gib"]) <= 0.5
        assert c["held_out_from"] == "the host's other profiled runs"


def test_vllm_batch_defaults_follow_the_device_as_vllm_serve_picks_them():
    from predictor.devices import resolve_device

    assert mem.vllm_batch_defaults(resolve_device("b200")) == (16384, 1024)  # 160 GiB or more
    assert mem.vllm_batch_defaults(resolve_device("h200")) == (8192, 1024)  # 140 GiB
    assert mem.vllm_batch_defaults(resolve_device("h100-sxm")) == (8192, 1024)
    assert mem.vllm_batch_defaults(resolve_device("a100-sxm-80gb")) == (2048, 256)  # A100s keep the small budget
    assert mem.vllm_batch_defaults(resolve_device("l40s")) == (2048, 256)
    h100 = predict("qwen3-0.6b", "h100-sxm", "BF16", 16384, "vllm", coefficients=None, launch=False)
    l40s = predict("qwen3-0.6b", "l40s", "BF16", 16384, "vllm", coefficients=None, launch=False)
    assert h100.serving["max_num_seqs"] == 1024 and l40s.serving["max_num_seqs"] == 256
    # the sampler's warm-up buffers: 1 + vllm_sampler_copies logits buffers of max_num_seqs x vocabulary x 4 bytes,
    # with the forward's hidden states: what llm-d logged on an H100 (5.56 GiB peak activation for this model)
    sampler = mem.vllm_sampler_bytes(h100.model, 8192, 1024, h100.coefficients["vllm_sampler_copies"])
    assert sampler / GIB == pytest.approx(5.56, rel=0.01)
    assert mem.vllm_activation_bytes(h100.model, 8192, 1024, h100.coefficients["vllm_sampler_copies"]) == sampler
    eager = predict("qwen3-0.6b", "h100-sxm", "BF16", 16384, "vllm", coefficients=None, launch=False,
                    enforce_eager=True)
    assert h100.values["runtime_bytes"] - eager.values["runtime_bytes"] == pytest.approx(
        h100.coefficients["vllm_graph_gib"] * GIB)
