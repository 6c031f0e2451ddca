"""llama.cpp's backend as part of the scenario: read from real llama-bench output and logs, defaulted per vendor,
asked for with --backend, and the expert tiles of a mixture of experts' prefill that it sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchcal.cli import main
from calibration.dataset import load_dataset, predict_block
from calibration.importers import import_llama_bench
from calibration.observations import load_observations
from harness.engines.llama_cpp.logparse import log_backend
from predictor.backends import find_backend, load_backends, resolve_backend
from predictor.coefficients import default_coefficients
from predictor.errors import BenchcalError
from predictor.estimate import predict_scenario
from predictor.models import resolve_model
from predictor.scenario import Scenario
from predictor.throughput import expert_padding_factor, prefill_matmul_flops

DATA = Path(__file__).parent / "data"
IMPORTED = DATA / "imported"


@pytest.mark.parametrize(("file", "model", "gpu", "backend"), [
    ("gpt-oss-guide/rtx-4090-gpt-oss-20b-mxfp4-d15396.md", "gpt-oss-20b", "rtx-4090", "CUDA"),
    ("llama3-gpu-benchmarks/M1max_64GB-8b-f16-cell11.md", "llama-3-8b", "macbook-pro-m1-max-64gb", "Metal"),
    ("strix-halo/ryzen-ai-max-395-llama-3.2-1b-q4_k_m-rocm.jsonl", "llama-3.2-1b", "ryzen-ai-max-395-128gb", "ROCm"),
    ("strix-halo/ryzen-ai-max-395-qwen3-32b-q8_0-vulkan.jsonl", "qwen3-32b", "ryzen-ai-max-395-128gb", "Vulkan"),
])
def test_the_backend_of_each_real_llama_bench_file_reaches_the_observations(tmp_path, file, model, gpu, backend):
    written, _ = import_llama_bench(IMPORTED / file, model=model, runs_dir=tmp_path, gpu=gpu,
                                    source_url="https://example.invalid/source")
    assert written
    obs = load_observations(tmp_path)
    assert set(obs.runs["backend"]) == {backend}


@pytest.mark.parametrize(("file", "backend"), [
    ("llama_cpp/mid-llama_context-cuda.log", "CUDA"),
    ("llama_cpp/old-llm_load_tensors-cuda-2gpu.log", "CUDA"),
    ("imported/ggml-ci/v100-pythia-2.8b-b4931/f16.log", "CUDA"),
    ("llama_cpp/smollm2-4layer-q4_0-cpu.log", "CPU"),
    ("llama_cpp/smollm2-oom-kv-cpu.log", "CPU"),
    ("imported/apple-silicon/macbook-pro-m1-pro-32gb-qwen2.5-14b-q5_k_m-vxiaozhi.md", "Metal"),
])
def test_the_backend_is_read_from_captured_logs(file, backend):
    assert log_backend((DATA / file).read_text(encoding="utf-8")) == backend


def test_backend_names_as_llama_bench_and_builds_print_them():
    assert find_backend("Metal,BLAS").id == "Metal"
    assert find_backend("BLAS,Metal").id == "Metal"
    assert find_backend("CUDA,BLAS").id == "CUDA"
    assert find_backend("BLAS").id == "CPU"
    assert find_backend("rocm").id == "ROCm"  # the harness's build kind
    assert find_backend("gpu") is None and find_backend(None) is None
    with pytest.raises(BenchcalError, match="unknown backend 'Cuba'.*CUDA"):
        resolve_backend("Cuba")


def test_every_read_tile_width_names_its_source():
    data = json.loads((Path(__file__).parent.parent / "predictor" / "data" / "backends.json").read_text())
    for entry in data["backends"]:
        assert "expert_tile_tokens" in entry["notes"], entry["id"]
        if entry["expert_tile_tokens"] is not None:
            assert entry["sources"]["expert_tile_tokens"].startswith("https://"), entry["id"]
    assert {b.id for b in load_backends()} >= {"CUDA", "ROCm", "Vulkan", "Metal", "SYCL", "CPU"}


@pytest.mark.parametrize(("device", "backend"), [
    ("rtx-4090", "CUDA"), ("rx-7900-xtx", "ROCm"), ("mi300x", "ROCm"), ("macbook-pro-m3-max-64gb", "Metal"),
    ("arc-pro-b60", "SYCL"), ("ryzen-ai-max-395-128gb", "ROCm"),
])
def test_a_device_takes_its_vendors_backend_by_default(device, backend):
    est = predict_scenario(Scenario(model="qwen3-8b", device=device, context=4096, prompt_tokens=512),
                           default_coefficients())
    assert est.to_dict()["backend"] == {"id": backend, "chosen": "vendor default", "expert_tile_tokens": None}


def test_vllm_has_no_llama_cpp_backend():
    est = predict_scenario(Scenario(model="qwen3-8b", device="h100-sxm", engine="vllm", context=4096),
                           default_coefficients())
    assert est.to_dict()["backend"] is None


def test_predict_names_the_backend_asked_for_in_text_and_json(capsys):
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "rx-7900-xtx", "--backend", "vulkan",
                 "--ctx", "4096", "--prompt", "512", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["backend"] == {"id": "Vulkan", "chosen": "asked", "expert_tile_tokens": None}
    assert main(["predict", "--model", "qwen3-30b-a3b", "--gpu", "rx-7900-xtx", "--ctx", "4096"]) == 0
    assert "llama.cpp (ROCm)" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpu", "rtx-4090", "--backend", "Metal"], "--backend Metal does not run on NVIDIA GeForce RTX 4090"),
    (["--gpu", "h100-sxm", "--engine", "vllm", "--backend", "CUDA"], "the backend is llama.cpp's"),
    (["--gpu", "rtx-4090", "--backend", "Cuba"], "unknown backend 'Cuba'"),
])
def test_a_backend_that_cannot_be_is_refused_in_one_line(capsys, argv, message):
    assert main(["predict", "--model", "qwen3-8b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- mixture-of-experts prefill


def test_expert_padding_is_one_without_tiles_or_experts():
    moe, dense = resolve_model("qwen3-30b-a3b"), resolve_model("qwen3-8b")
    assert expert_padding_factor(moe, 512, 1) == pytest.approx(1.0)
    assert expert_padding_factor(moe, 512, None) == pytest.approx(1.0)
    assert expert_padding_factor(dense, 512, 128) == pytest.approx(1.0)
    n = np.array([512.0, 2048.0])
    assert np.allclose(prefill_matmul_flops(moe, n, 512, 1), prefill_matmul_flops(moe, n))


def test_expert_padding_counts_the_tiles_each_touched_expert_fills():
    # 128 experts, 8 per token, a 512-token ubatch: about 32 tokens an expert, each touched expert one 128-column
    # tile, so the routed experts compute about four times the columns routed to them
    moe = resolve_model("qwen3-30b-a3b")
    assert (moe.num_experts, moe.experts_per_token) == (128, 8)
    assert expert_padding_factor(moe, 512, 128) == pytest.approx(4.0, rel=1e-3)
    # a 2048-token ubatch: 128 tokens an expert on average, one or two tiles each
    assert 1.0 < expert_padding_factor(moe, 2048, 128) < 1.6
    # the binomial sum itself: 2 experts, 1 each, 2 tokens, tiles of 2 columns: each expert is touched with
    # probability 3/4 and then computes 2 columns: 3 columns for 2 routed
    from predictor.throughput import _padded_expert_columns
    assert _padded_expert_columns(2, 2, 1, 2) == pytest.approx(3.0)
    assert _padded_expert_columns(2, 2, 1, 1) == pytest.approx(2.0)


def test_a_quantized_moe_on_a_cuda_gpu_prefills_at_the_padded_rate():
    quick = Scenario(model="qwen3-30b-a3b", device="rtx-4090", quant="Q4_K_M", context=4096, prompt_tokens=512)
    table = default_coefficients()
    cuda = predict_scenario(quick, table)
    cpu_like = predict_scenario(quick.replace(backend="Vulkan"), table)  # a backend whose tiles are not modelled
    assert cuda.to_dict()["backend"]["expert_tile_tokens"] == 128
    assert cuda.values["prefill_tok_s"] < 0.6 * cpu_like.values["prefill_tok_s"]
    # F16 experts go through cuBLAS per expert on CUDA: no tiles
    f16 = predict_scenario(quick.replace(quant="F16", context=2048), table)
    assert f16.to_dict()["backend"]["expert_tile_tokens"] == 1


@pytest.mark.parametrize(("file", "model", "gpu", "low", "high"), [
    # llm-tracker's RTX PRO 6000, Qwen3-30B-A3B Q4_K_M pp512 (ubatch 512): 7,432 tok/s measured, 3.4x too fast
    # without the tiles
    ("llm-tracker/rtx-pro-6000-qwen3-30b-a3b-q4_k_m.md", "qwen3-30b-a3b", "rtx-pro-6000", 1.5, 2.0),
    # llama.cpp's DGX Spark benches, gpt-oss-120b MXFP4 pp2048 at ubatch 2048: 1.77x too fast without the tiles
    ("llama-cpp-benches/dgx-spark-gpt-oss-120b.md", "gpt-oss-120b", "dgx-spark", 0.95, 1.2),
])
def test_the_moe_prefill_formula_on_captured_llama_bench_rows(tmp_path, file, model, gpu, low, high):
    import_llama_bench(IMPORTED / file, model=model, runs_dir=tmp_path, gpu=gpu, source_url="https://example.invalid/s")
    block = load_dataset([tmp_path]).blocks["prefill"]
    from predictor.coefficients import load_coefficients
    table = load_coefficients(Path(__file__).parent.parent / "calibration" / "coefficients.json")
    predicted_s = predict_block(block, table)
    ratio = block.y / predicted_s  # predicted speed over measured speed
    meta = block.meta.reset_index(drop=True)
    empty_cache = meta[meta["prompt_depth"].fillna(0) == 0]
    row = int(empty_cache["prompt_tokens"].idxmin())  # the shortest prompt from an empty cache
    assert low < ratio[row] < high


def test_volta_prompts_multiply_quantized_weights_through_an_fp16_copy(monkeypatch):
    """ggml_cuda_should_use_mmq: no int8 MMA on Volta, so a prompt's quantized weights go to cuBLAS in every build,
    priced with the copy's traffic (prefill_dequant_bytes_per_weight); F16 weights and Turing-or-later GPUs not."""
    from predictor.backends import Backend
    from predictor.devices import resolve_device
    from predictor.models import resolve_model
    from predictor.scenario import scenario_inputs

    cuda = find_backend("CUDA")
    assert cuda.quantized_prefill_through_fp16("volta") and not cuda.quantized_prefill_through_fp16("ampere")
    arch = resolve_model("llama-3-8b")
    for device, expected in (("v100-pcie-16gb", True), ("rtx-4090", False)):
        dev = resolve_device(device)
        inputs = scenario_inputs(Scenario(model=arch, device=dev, quant="Q4_0"), arch, dev, "llama.cpp")
        assert inputs.kwargs["cublas_dequant"] is expected

    def prefill(quant: str) -> float:
        return predict_scenario(Scenario(model="llama-3-8b", device="v100-pcie-16gb", quant=quant, context=4096,
                                         prompt_tokens=512, engine_build=5000)).values["prefill_s"]

    through_copy = {q: prefill(q) for q in ("Q4_0", "F16")}
    monkeypatch.setattr(Backend, "quantized_prefill_through_fp16", lambda self, architecture: False)
    assert through_copy["Q4_0"] > prefill("Q4_0")
    assert through_copy["F16"] == pytest.approx(prefill("F16"))
