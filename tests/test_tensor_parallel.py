"""Tensor parallelism as vLLM does it, on the catalogue's configs of Llama-3.1-70B (64 query / 8 KV heads),
Qwen3-30B-A3B (32 / 4, a mixture of experts) and DeepSeek-V3 (128 heads, MLA's 512 + 64 latent): heads split over
the ranks, KV heads replicated where there are fewer than ranks, MLA's latent cache whole on every rank, the
all-reduces in the step, and the sizes vLLM refuses."""

from __future__ import annotations

import dataclasses

import pytest

from predictor import memory as mem
from predictor import throughput as tp
from predictor.coefficients import _default_values
from predictor.errors import BenchcalError
from predictor.estimate import GIB, predict
from predictor.models import resolve_model


def _kv(est) -> float:
    return float(est.values["kv_cache_bytes"])


def test_llama_3_1_70b_splits_its_eight_kv_heads_and_replicates_them_past_eight_ranks():
    arch = resolve_model("llama-3.1-70b")
    assert (arch.num_attention_heads, arch.num_kv_heads) == (64, 8)
    eight = mem.tensor_parallel_shards(arch, 8, "vllm")
    assert eight["attention_heads_per_rank"] == 8 and eight["kv_heads_per_rank"] == 1 and eight["kv_replicas"] == 1
    sixteen = mem.tensor_parallel_shards(arch, 16, "vllm")
    assert sixteen["kv_heads_per_rank"] == 1 and sixteen["kv_replicas"] == 2.0
    one = predict(arch, "h100-sxm", "FP8", 8192, "vllm", coefficients=None)
    four = predict(arch, "h100-sxm", "FP8", 8192, "vllm", device_count=4, coefficients=None)
    assert _kv(four) == pytest.approx(_kv(one))  # split, not copied: all ranks together hold the model's KV once
    d = four.to_dict()["tensor_parallel"]
    assert d["size"] == 4 and d["kv_heads_per_rank"] == 2
    assert d["kv_cache_per_rank_gib"] == pytest.approx(_kv(one) / 4 / GIB, abs=1e-3)
    assert one.to_dict()["tensor_parallel"] is None


def test_qwen3_30b_a3b_replicates_its_four_kv_heads_on_eight_ranks():
    arch = resolve_model("qwen3-30b-a3b")
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.is_moe) == (32, 4, True)
    shards = mem.tensor_parallel_shards(arch, 8, "vllm")
    assert shards["attention_heads_per_rank"] == 4 and shards["kv_heads_per_rank"] == 1
    assert shards["kv_replicas"] == 2.0 and "replicated" in shards["kv_split"]
    one, four, eight = (predict(arch, "h200-sxm", "BF16", 8192, "vllm", device_count=n, coefficients=None)
                        for n in (1, 4, 8))
    assert _kv(four) == pytest.approx(_kv(one)) and _kv(eight) == pytest.approx(2 * _kv(one))
    # each rank holds one KV head at 4 and at 8 ranks: one sequence costs a rank the same bytes, so the pool's
    # tokens follow the pool's bytes
    per_token_4 = four.serving["kv_pool_gib"] / four.serving["kv_pool_tokens"]
    per_token_8 = eight.serving["kv_pool_gib"] / eight.serving["kv_pool_tokens"]
    assert per_token_8 == pytest.approx(per_token_4, rel=1e-3)
    # the layer split (llama.cpp) copies nothing
    assert mem.kv_replicas(arch, 8, "llama.cpp") == 1.0


def test_deepseek_v3_keeps_its_mla_latent_whole_on_every_rank():
    arch = resolve_model("deepseek-v3")
    assert arch.is_mla and arch.num_attention_heads == 128 and arch.num_layers == 61
    shards = mem.tensor_parallel_shards(arch, 8, "vllm")
    assert shards["attention_heads_per_rank"] == 16 and shards["kv_replicas"] == 8.0
    one = predict(arch, "h200-sxm", "FP8", 8192, "vllm", coefficients=None)
    eight = predict(arch, "h200-sxm", "FP8", 8192, "vllm", device_count=8, coefficients=None)
    assert _kv(eight) == pytest.approx(8 * _kv(one))
    # a rank's pool holds sequences of the whole latent: 61 layers x (512 + 64) elements x 2 bytes a token
    pool = eight.serving
    per_token = 61 * (512 + 64) * 2
    assert pool["kv_pool_tokens"] == pytest.approx(pool["kv_pool_gib"] * GIB / per_token, rel=2e-3)
    assert eight.to_dict()["tensor_parallel"]["kv_split"].startswith("MLA latent")


def test_vllm_refuses_a_size_that_does_not_divide_the_heads_and_says_why():
    with pytest.raises(BenchcalError, match=r"attention heads \(32\) must be divisible by tensor parallel size \(3\)"):
        predict("qwen3-30b-a3b", "h100-sxm", "BF16", 8192, "vllm", device_count=3, coefficients=None)
    # KV heads that neither split over nor replicate evenly on the ranks (48 query heads, 6 KV heads, 4 ranks)
    odd = dataclasses.replace(resolve_model("llama-3.1-70b"), num_attention_heads=48, num_kv_heads=6)
    assert mem.tensor_parallel_refusal(odd, 4) is not None and mem.tensor_parallel_refusal(odd, 6) is None
    assert mem.tensor_parallel_refusal(odd, 12) is None  # 12 ranks: each of the 6 heads on 2 ranks
    # llama.cpp's layer split has no such rule
    assert predict("qwen3-30b-a3b", "h100-sxm", "Q4_K_M", 8192, device_count=3, coefficients=None).device_count == 3
    # and a llama.cpp prediction's vLLM command says vLLM would refuse, instead of a command that fails
    three = predict("llama-3.1-8b", "rtx-3090", "Q4_K_M", 8192, device_count=3, coefficients=None)
    assert three.launch["vllm"].startswith("# vLLM refuses --tensor-parallel-size 3")


def test_the_tensor_parallel_step_pays_two_all_reduces_a_layer_in_prefill_as_in_decode():
    arch = resolve_model("llama-3.1-70b")
    base = _default_values("vllm")  # the engine defaults, as a plain mapping
    slow = {**base, "tp_allreduce_us": base["tp_allreduce_us"] + 100.0}
    kw = dict(prompt_tokens=4096, n_ubatch=2048, device_weight_bytes=70e9, host_weight_bytes=0.0,
              bandwidth_gbs=3350.0, tflops=989.0, device_count=4)
    extra = tp.prefill_seconds(arch, slow, **kw) - tp.prefill_seconds(arch, base, **kw)
    assert extra == pytest.approx(2 * 2 * 80 * 100e-6)  # 2 chunks x 2 all-reduces x 80 layers x 100 us
    one = {**kw, "device_count": 1}
    assert tp.prefill_seconds(arch, slow, **one) == pytest.approx(tp.prefill_seconds(arch, base, **one))


def test_a_published_tp8_mla_log_holds_the_whole_latent_on_each_rank():
    # vLLM's recipe for Kimi-K2-Thinking (DeepSeek-V3's attention) on 8 H200s: 46.80 GiB of KV on one rank held
    # 715,072 tokens (tests/data/vllm/tp/README.md). The per-rank bytes a token predict it within the log's rounding
    # of the GiB figure; a latent split over the ranks would read 8 times as many tokens.
    import re
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "vllm" / "tp" / "kimi-k2-thinking-tp8-h200.log").read_text()
    gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", text).group(1))
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    arch = resolve_model("deepseek-v3")
    per_rank = mem.kv_cache_bytes(arch, 1, 1, 2.0, "llama.cpp") * mem.kv_replicas(arch, 8, "vllm") / 8
    assert gib * GIB / per_rank == pytest.approx(tokens, rel=2e-3)
