"""Synthetic GGUF checkpoints: tensor types follow llama.cpp's rules, files are valid and cached."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from harness import synthetic
from predictor.errors import BenchcalError


def types_by_name(spec, file_type):
    return {t.name: t.ggml_type for t in synthetic.tensor_plan(spec, file_type)}


def test_q4_k_m_gives_more_bits_to_some_attn_v_and_ffn_down_layers():
    spec = synthetic.resolve_spec("llama-3.1-8b")  # 32 layers, rows of 4096 / 14336 values
    types = types_by_name(spec, "Q4_K_M")
    more_bits = [i for i in range(32) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    # llama.cpp use_more_bits: first and last eighth, and every third layer in between
    assert more_bits == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == more_bits
    assert types["blk.4.attn_q.weight"] == "Q4_K" and types["token_embd.weight"] == "Q4_K"
    assert types["output.weight"] == "Q6_K"
    assert types["blk.0.attn_norm.weight"] == "F32"


def test_rows_not_divisible_by_256_fall_back_like_llama_cpp():
    spec = synthetic.resolve_spec("smollm2-135m")  # hidden 576 = 2.25 x 256, tied embeddings
    types = types_by_name(spec, "Q4_K_M")
    assert types["blk.5.attn_q.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert types["blk.0.attn_v.weight"] == "Q8_0"  # Q6_K -> Q8_0
    assert types["token_embd.weight"] == "Q8_0"  # tied output tensor with incompatible rows -> Q8_0
    assert "output.weight" not in types


def test_q4_0_keeps_untied_embeddings_and_puts_output_in_q6_k():
    types = types_by_name(synthetic.resolve_spec("llama-3.1-8b"), "Q4_0")
    assert types["token_embd.weight"] == "Q4_0" and types["output.weight"] == "Q6_K"
    assert types["blk.0.ffn_down.weight"] == "Q4_0"


def test_qwen2_layout_has_qkv_biases_and_moe_has_expert_tensors():
    qwen = {t.name for t in synthetic.tensor_plan(synthetic.resolve_spec("qwen2.5-0.5b"), "Q8_0")}
    assert "blk.0.attn_q.bias" in qwen and "blk.0.attn_v.bias" in qwen
    moe = synthetic.tensor_plan(synthetic.resolve_spec("qwen3-30b-a3b", {"num_layers": 2}), "Q4_K_M")
    gate = next(t for t in moe if t.name == "blk.0.ffn_gate_exps.weight")
    assert gate.shape == (128, 768, 2048)


def test_weights_bytes_is_sum_of_blocks():
    spec = synthetic.resolve_spec("smollm2-135m")
    plan = synthetic.tensor_plan(spec, "Q8_0")
    q_proj = next(t for t in plan if t.name == "blk.0.attn_q.weight")
    assert q_proj.nbytes == 576 * 576 // 32 * 34
    assert synthetic.weights_bytes(spec, "Q8_0") == sum(t.nbytes for t in plan)


def test_written_file_matches_plan_and_has_finite_scales(tmp_path):
    spec = synthetic.resolve_spec("smollm2-135m", {"num_layers": 2, "vocab_size": 512})
    path = synthetic.write_synthetic_gguf(spec, "Q4_0", tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    plan = {t.name: t for t in synthetic.tensor_plan(spec, "Q4_0")}
    assert {t.name for t in reader.tensors} == set(plan)
    for tensor in reader.tensors:
        assert tensor.tensor_type.name == plan[tensor.name].ggml_type
        assert int(tensor.n_bytes) == plan[tensor.name].nbytes
    q_proj = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    scales = np.asarray(q_proj.data, dtype=np.uint8).reshape(-1, 18)[:, :2].copy().view(np.float16)
    assert np.isfinite(scales).all() and (scales > 0).all()
    fields = reader.fields
    assert int(fields["llama.block_count"].parts[-1][0]) == 2
    assert len(fields["tokenizer.ggml.tokens"].data) == 512


def test_cache_reuses_the_file_and_seed_changes_it(tmp_path):
    first = synthetic.synthetic_gguf("smollm2-135m", "q8_0", {"num_layers": 1, "vocab_size": 300}, directory=tmp_path)
    stamp = first.stat().st_mtime_ns
    again = synthetic.synthetic_gguf("smollm2-135m", "Q8_0", {"num_layers": 1, "vocab_size": 300}, directory=tmp_path)
    other = synthetic.synthetic_gguf("smollm2-135m", "Q8_0", {"num_layers": 1, "vocab_size": 300}, seed=1,
                                     directory=tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert other != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCHCAL_CACHE", str(tmp_path))
    assert synthetic.cache_dir() == tmp_path


def test_user_errors_are_one_line_benchcal_errors():
    with pytest.raises(BenchcalError, match="did you mean"):
        synthetic.normalize_file_type("Q4_K_N")
    with pytest.raises(BenchcalError, match="MLA"):
        synthetic.resolve_spec("deepseek-v3")
    with pytest.raises(BenchcalError, match="cannot override"):
        synthetic.resolve_spec("smollm2-135m", {"hidden_size": 64})


def test_overrides_rebuild_the_predictor_architecture():
    arch = synthetic.resolve_arch("smollm2-135m", {"num_layers": 4, "vocab_size": 4096})
    full = synthetic.resolve_arch("smollm2-135m")
    assert arch.num_layers == 4 and arch.vocab_size == 4096
    assert arch.params_total < full.params_total
