"""How a run config becomes vLLM's arguments, and the config-only synthetic model directories."""

from __future__ import annotations

import json

import pytest

from harness import synthetic_hf
from harness.engines.vllm import engine as vllm_engine
from harness.engines.vllm import options as vllm_options
from harness.engines.vllm.child import kv_need_bytes, llm_kwargs
from predictor.errors import BenchcalError
from predictor.models import resolve_model

SHRUNK = {"num_layers": 2, "vocab_size": 4096}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHCAL_CACHE", str(tmp_path))
    return tmp_path


def cpu_config(**overrides):
    config = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "context": 1024, "batch": 1,
              "kv_dtype": "f16", "quant": None, "device_count": 1, "engine_options": {}}
    config.update(overrides)
    return config


def test_synthetic_dir_holds_the_catalogue_config_shrunk(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    original = synthetic_hf.catalogue_config("qwen2.5-0.5b")
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 4096
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rope_theta"):
        assert config[key] == original[key]
    assert synthetic_hf.is_synthetic_dir(folder)
    assert folder.parent == cache / "synthetic-hf"


def test_synthetic_dirs_are_cached_by_content(cache):
    first = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert synthetic_hf.synthetic_hf_dir("Qwen/Qwen2.5-0.5B-Instruct", SHRUNK).name.endswith(first.name[-16:])
    assert synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    assert synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", {"num_layers": 3}) != first
    assert synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b") != first


def test_shrinking_a_multimodal_config_cuts_the_text_model_and_its_layer_pattern():
    config = synthetic_hf.catalogue_config("gemma-3-4b")
    shrunk = synthetic_hf.shrink_config(config, {"num_layers": 6, "vocab_size": 1024})
    text = shrunk["text_config"]
    assert text["num_hidden_layers"] == 6 and text["vocab_size"] == 1024
    if "layer_types" in text:
        assert len(text["layer_types"]) == 6
    with pytest.raises(BenchcalError, match="cannot override"):
        synthetic_hf.shrink_config(config, {"layers": 2})


def test_a_config_is_rebuilt_from_the_architecture_when_no_config_is_stored():
    arch = resolve_model("llama-3.1-8b")
    config = synthetic_hf.config_from_arch(arch)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (32, 8, 128)
    with pytest.raises(BenchcalError, match="cannot build a synthetic vLLM model"):
        synthetic_hf.config_from_arch(resolve_model("deepseek-v3"))


def test_pinned_kv_pool_covers_the_context_in_128_token_blocks_plus_the_null_block(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    per_token_bytes = 2 * 2 * 2 * 64 * 2  # layers x K,V x kv heads x head dim x 2 bytes
    # (1024 tokens + one more block) per sequence, plus vLLM's reserved null block.
    assert kv_need_bytes(config, 1024, 1, "f16", "x") == (1024 + 128 + 128) * per_token_bytes
    assert kv_need_bytes(config, 1000, 4, "bf16", "x") == (4 * (1024 + 128) + 128) * per_token_bytes
    assert kv_need_bytes(config, 1024, 1, "fp8", "x") == (1024 + 128 + 128) * per_token_bytes // 2


def test_cpu_config_becomes_eager_pinned_llm_arguments(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    kwargs, resolved = llm_kwargs(cpu_config(batch=2), folder, "dummy", config)
    assert kwargs["model"] == str(folder) and kwargs["load_format"] == "dummy"
    assert kwargs["skip_tokenizer_init"] is True and kwargs["enable_prefix_caching"] is False
    assert (kwargs["max_model_len"], kwargs["max_num_seqs"]) == (1024, 2)
    assert kwargs["enforce_eager"] is True and kwargs["kv_cache_dtype"] == "auto"
    assert kwargs["disable_log_stats"] is False  # per-request metrics need stats
    need = kv_need_bytes(config, 1024, 2, "f16", "x")
    assert resolved["kv_need_bytes"] == need
    assert kwargs["kv_cache_memory_bytes"] == vllm_options.pinned_kv_cache_bytes(need) > need
    assert resolved["kv_pool"] == "pinned"


def test_gpu_defaults_keep_cuda_graphs_and_profiled_pools_leave_sizing_to_vllm(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    gpu = cpu_config(device="h200", engine_options={"kv_pool": "profiled"})
    kwargs, resolved = llm_kwargs(gpu, folder, "dummy", config)
    assert kwargs["enforce_eager"] is False
    assert kwargs["kv_cache_memory_bytes"] is None and kwargs["gpu_memory_utilization"] == 0.9
    assert resolved["kv_pool"] == "profiled"
    explicit = cpu_config(engine_options={"kv_cache_memory_bytes": 123456789, "max_num_batched_tokens": 2048})
    kwargs, _ = llm_kwargs(explicit, folder, "dummy", config)
    assert kwargs["kv_cache_memory_bytes"] == 123456789 and kwargs["max_num_batched_tokens"] == 2048


def test_user_mistakes_in_vllm_options_are_one_line_errors(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(BenchcalError, match="kv_pool"):
        llm_kwargs(cpu_config(engine_options={"kv_pool": "all"}), folder, "dummy", config)
    with pytest.raises(BenchcalError, match="not supported by vLLM"):
        llm_kwargs(cpu_config(kv_dtype="q8_0"), folder, "dummy", config)
    with pytest.raises(BenchcalError, match="cannot be made synthetic"):
        llm_kwargs(cpu_config(quant="Q4_K_M"), folder, "dummy", config)


def test_fp8_kv_and_weights_map_to_vllm_names():
    assert vllm_options.kv_cache_dtype("fp8") == "fp8" and vllm_options.kv_bytes_per_element("fp8") == 1
    assert vllm_options.kv_cache_dtype("bf16") == "auto" and vllm_options.kv_bytes_per_element("bf16") == 2


def test_default_options_say_how_the_kv_pool_is_sized():
    cpu = vllm_options.default_engine_options({"device": "cpu"})
    assert cpu == {"kv_pool": "pinned", "enforce_eager": True, "gpu_memory_utilization": 0.3}
    gpu = vllm_options.default_engine_options({"device": "l4", "engine_options": {"enforce_eager": True}})
    assert gpu["enforce_eager"] is True and gpu["gpu_memory_utilization"] == 0.9


def test_version_is_read_without_importing_vllm():
    import sys

    before = "vllm" in sys.modules
    version = vllm_engine.VllmEngine.version()
    assert ("vllm" in sys.modules) == before
    assert set(version) == {"engine_version", "engine_commit", "engine_build"}


def test_the_unbuilt_server_api_is_an_error_not_a_fallback(cache):
    folder = synthetic_hf.synthetic_hf_dir("qwen2.5-0.5b", SHRUNK)
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(BenchcalError, match="not implemented"):
        llm_kwargs(cpu_config(engine_options={"api": "serve"}), folder, "dummy", config)
