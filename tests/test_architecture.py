"""Architecture math: parameter counts, KV elements per token, sliding windows, GGUF and HF-dir readers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from predictor.architecture import ModelArch, from_hf_config
from predictor.checkpoints import from_gguf, from_hf_dir
from predictor.errors import BenchcalError
from predictor.models import load_catalogue_entries, resolve_model

GIB = 1024**3
CONFIGS = Path(__file__).parent / "data" / "configs"


def catalogue_config(model_id: str) -> dict:
    return next(e for e in load_catalogue_entries() if e["id"] == model_id)["config"]


# --- Qwen2.5-72B: the reference dense GQA model -------------------------------------------------------


def test_qwen25_72b_params_match_published_72_71b():
    arch = resolve_model("qwen2.5-72b")
    assert arch.params_total == pytest.approx(72.71e9, rel=0.005)


def test_qwen25_72b_kv_per_token_is_2_x_80_layers_x_8_kv_heads_x_128():
    arch = resolve_model("qwen2.5-72b")
    assert arch.kv_elements_per_token_full == 2 * 80 * 8 * 128
    assert arch.kv_elements_per_token_window == 0
    assert arch.kv_elements_per_token(1) == 2 * 80 * 8 * 128


def test_qwen25_72b_fp16_kv_at_8k_is_2_5_gib_and_at_32k_is_10_gib():
    arch = resolve_model("qwen2.5-72b")
    assert arch.kv_elements_per_token(8192) * 2 == 2.5 * GIB
    assert arch.kv_elements_per_token(32768) * 2 == 10.0 * GIB


def test_kv_elements_accept_numpy_arrays_elementwise():
    arch = resolve_model("gemma-3-27b")
    contexts = np.array([512, 1024, 32768])
    got = arch.kv_elements_per_token(contexts)
    assert isinstance(got, np.ndarray)
    assert list(got) == [arch.kv_elements_per_token(int(s)) for s in contexts]


# --- MLA and sliding windows ----------------------------------------------------------------------------


def test_deepseek_v3_mla_caches_latent_plus_rope_key_per_layer():
    arch = resolve_model("deepseek-v3")
    assert arch.attention == "mla"
    assert arch.kv_elements_per_token_full == 61 * (512 + 64)
    assert arch.kv_elements_per_token(4096) == 61 * 576 * 4096


def test_deepseek_v3_counts_main_model_without_mtp_layer():
    arch = resolve_model("deepseek-v3")
    # 671B main model (the published 685B adds the 14B multi-token-prediction module)
    assert arch.params_total == pytest.approx(671.0e9, rel=0.001)
    assert (arch.num_experts, arch.experts_per_token) == (256, 8)
    assert arch.params_expert == 58 * 256 * 3 * 7168 * 2048  # 3 dense layers, then 58 MoE layers


def test_gemma3_27b_kv_at_32k_counts_52_sliding_layers_at_1024_and_10_full_layers():
    arch = resolve_model("gemma-3-27b")
    per_layer = 2 * 16 * 128  # 16 KV heads x head_dim 128, K and V
    full_layers, sliding_layers = 10, 52  # 5 local : 1 global over 62 layers; layers 6, 12, ..., 60 global
    expected = full_layers * per_layer * 32768 + sliding_layers * per_layer * 1024
    assert arch.sliding_window == 1024
    assert arch.kv_elements_per_token(32768) == expected == 1_560_281_088


def test_gpt_oss_alternates_sliding_window_128_and_full_layers():
    arch = resolve_model("gpt-oss-120b")
    per_layer = 2 * 8 * 64
    assert arch.sliding_window == 128
    assert arch.kv_elements_per_token_full == arch.kv_elements_per_token_window == 18 * per_layer
    assert arch.kv_elements_per_token(100) == 36 * per_layer * 100


def test_qwen25_use_sliding_window_false_means_all_layers_full():
    cfg = catalogue_config("qwen2.5-72b")
    assert cfg["sliding_window"] == 131072 and cfg["use_sliding_window"] is False
    arch = from_hf_config(cfg, id="q", source="test")
    assert arch.sliding_window is None and arch.kv_elements_per_token_window == 0


def test_mistral_style_sliding_window_applies_to_every_layer():
    cfg = {**catalogue_config("mistral-small-24b"), "sliding_window": 4096}
    arch = from_hf_config(cfg, id="m", source="test")
    assert arch.kv_elements_per_token_full == 0
    assert arch.kv_elements_per_token(10_000) == 40 * 2 * 8 * 128 * 4096


def test_attention_flops_per_position_are_4_x_heads_x_head_dim_per_layer():
    arch = resolve_model("llama-3.1-8b")
    assert arch.attn_flops_per_position_full == 32 * 4 * 32 * 128
    assert arch.attn_flops_per_token(1000) == 1000 * 32 * 4 * 32 * 128


# --- parameter accounting ---------------------------------------------------------------------------------


def test_dense_untied_active_params_exclude_only_the_input_embedding():
    arch = resolve_model("llama-3.1-8b")
    assert arch.params_embedding == arch.params_output == 128256 * 4096
    assert arch.params_active == arch.params_total - arch.params_embedding


def test_dense_tied_active_params_count_the_shared_table_once_as_lm_head():
    arch = resolve_model("smollm2-135m")
    assert arch.tie_embeddings and arch.params_output == 0
    assert arch.params_active == arch.params_total


def test_moe_active_params_count_k_of_e_experts():
    arch = resolve_model("mixtral-8x7b")
    unselected = arch.params_expert * 6 // 8
    assert arch.params_active == arch.params_total - arch.params_embedding - unselected
    assert arch.params_active_published_style == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize(("model", "layers", "moe_layers"), [
    ("gpt-oss-20b", 24, 24), ("qwen3-30b-a3b", 48, 48), ("deepseek-v3", 61, 58),  # DeepSeek: 3 dense layers first
    ("mixtral-8x7b", 32, 32), ("llama-3.1-8b", 32, 0)])
def test_moe_layers_are_counted_from_the_config(model, layers, moe_layers):
    arch = resolve_model(model)
    assert (arch.num_layers, arch.num_moe_layers) == (layers, moe_layers)


def test_qwen2_counts_qkv_biases_and_qwen3_counts_qk_norms():
    qwen2 = from_hf_config(catalogue_config("qwen2.5-7b"), id="a", source="t")
    as_llama = from_hf_config({**catalogue_config("qwen2.5-7b"), "model_type": "llama"}, id="b", source="t")
    assert qwen2.params_total - as_llama.params_total == 28 * (3584 + 2 * 512)
    qwen3 = from_hf_config(catalogue_config("qwen3-8b"), id="c", source="t")
    no_norm = from_hf_config({**catalogue_config("qwen3-8b"), "model_type": "llama"}, id="d", source="t")
    assert qwen3.params_total - no_norm.params_total == 36 * 2 * 128


def test_gemma3_vision_tower_is_resident_but_not_active():
    arch = resolve_model("gemma-3-4b")
    assert arch.params_extra == 417_000_000
    assert arch.params_active == arch.params_total - arch.params_extra  # tied table read as LM head
    assert arch.params_per_layer * 34 == pytest.approx(3_209_008_128)  # Gemma 3 report: 3,209M non-embedding


def test_missing_config_field_raises_naming_field_and_file():
    path = CONFIGS / "missing-num-hidden-layers.config.json"
    with pytest.raises(BenchcalError, match=r"config.json at .*missing-num-hidden-layers.* is missing field "
                                            r"'num_hidden_layers'"):
        resolve_model(str(path))


def test_moe_config_without_experts_per_token_raises():
    cfg = {k: v for k, v in catalogue_config("mixtral-8x7b").items() if k != "num_experts_per_tok"}
    with pytest.raises(BenchcalError, match="missing field 'num_experts_per_tok'"):
        from_hf_config(cfg, id="m", source="/x/config.json")


# --- GGUF -------------------------------------------------------------------------------------------------


def write_tiny_llama_gguf(path: Path, *, tied: bool = False) -> dict[str, int]:
    """A 2-layer llama GGUF with F32 norms, F16 embeddings and Q8_0 matrices. Returns element/byte sums."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, ff, vocab, layers = 64, 4, 2, 128, 256, 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(2048)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_name("tiny llama")
    totals = {"elements": 0, "bytes": 0}

    def add(name: str, shape: tuple[int, ...], qtype) -> None:
        data = rng.standard_normal(shape).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            totals["bytes"] += data.size // 32 * 34
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype))
            totals["bytes"] += data.size * (2 if qtype == gguf.GGMLQuantizationType.F16 else 4)
        totals["elements"] += data.size

    f16, q8, f32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    head_dim = hidden // heads
    add("token_embd.weight", (vocab, hidden), f16)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,), f32)
        add(f"blk.{i}.attn_q.weight", (heads * head_dim, hidden), q8)
        add(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden), q8)
        add(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden), q8)
        add(f"blk.{i}.attn_output.weight", (hidden, heads * head_dim), q8)
        add(f"blk.{i}.ffn_norm.weight", (hidden,), f32)
        add(f"blk.{i}.ffn_gate.weight", (ff, hidden), q8)
        add(f"blk.{i}.ffn_up.weight", (ff, hidden), q8)
        add(f"blk.{i}.ffn_down.weight", (hidden, ff), q8)
    add("output_norm.weight", (hidden,), f32)
    if not tied:
        add("output.weight", (vocab, hidden), q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return totals


def test_gguf_params_and_bytes_are_exact_sums_over_tensors(tmp_path):
    path = tmp_path / "tiny-llama.Q8_0.gguf"
    totals = write_tiny_llama_gguf(path)
    arch = from_gguf(path)
    assert arch.params_total == totals["elements"]
    assert arch.weights_bytes_exact == totals["bytes"]
    assert arch.weights_quant == "Q8_0"
    assert (arch.architecture, arch.num_layers, arch.hidden_size, arch.vocab_size) == ("llama", 2, 64, 256)
    assert arch.kv_elements_per_token_full == 2 * 2 * 2 * 16
    assert arch.params_embedding == arch.params_output == 256 * 64
    assert arch.params_active == arch.params_total - arch.params_embedding
    assert arch.max_context == 2048 and arch.name == "tiny llama"


def test_gguf_without_output_tensor_is_tied(tmp_path):
    path = tmp_path / "tied.gguf"
    totals = write_tiny_llama_gguf(path, tied=True)
    arch = from_gguf(path)
    assert arch.tie_embeddings and arch.params_output == 0
    assert arch.params_active == arch.params_total == totals["elements"]


def test_resolve_model_reads_a_gguf_path(tmp_path):
    path = tmp_path / "Tiny-Llama.gguf"
    totals = write_tiny_llama_gguf(path)
    arch = resolve_model(str(path))
    assert arch.id == "tiny-llama" and arch.source == str(path)
    assert arch.params_total == totals["elements"]


def test_gguf_moe_and_sliding_window_metadata(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny-gemma3.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in [("block_count", 12), ("context_length", 4096), ("embedding_length", 32),
                       ("feed_forward_length", 64), ("attention.head_count", 2), ("attention.head_count_kv", 1),
                       ("attention.key_length", 16), ("attention.value_length", 16),
                       ("attention.sliding_window", 512), ("expert_count", 4), ("expert_used_count", 2)]:
        writer.add_uint32(f"gemma3.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((100, 32), np.float16))
    writer.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 64, 32), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arch = from_gguf(path)
    assert arch.sliding_window == 512
    assert arch.kv_elements_per_token_full == 2 * 32 and arch.kv_elements_per_token_window == 10 * 32
    assert arch.params_expert == 4 * 64 * 32
    assert arch.params_active == arch.params_total - 100 * 32 - arch.params_expert // 2 + 100 * 32
    assert arch.num_moe_layers == 1  # the blocks holding expert tensors


def test_unreadable_gguf_raises_benchcal_error(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(BenchcalError, match="broken.gguf"):
        from_gguf(path)


# --- Hugging Face directories -------------------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    """Write a safetensors file whose tensors hold zeros; returns the data bytes."""
    header, offset = {}, 0
    for name, (dtype, shape, itemsize) in tensors.items():
        size = int(np.prod(shape)) * itemsize
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return offset


def test_hf_dir_takes_exact_bytes_from_the_index_total_size(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(catalogue_config("smollm2-135m")))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 123456},
                                                                       "weight_map": {}}))
    arch = from_hf_dir(tmp_path)
    assert arch.weights_bytes_exact == 123456 and arch.weights_quant == "BF16"
    assert arch.params_total == resolve_model("smollm2-135m").params_total


def test_hf_dir_sums_safetensors_headers_without_an_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(catalogue_config("smollm2-135m")))
    first = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [4, 8], 2)})
    second = write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                               {"b": ("BF16", [16], 2), "c": ("F32", [2], 4)})
    arch = resolve_model(str(tmp_path))
    assert arch.weights_bytes_exact == first + second == 64 + 32 + 8
    assert arch.weights_quant == "BF16"


def test_config_json_path_resolves_with_its_directory_name_as_id(tmp_path):
    model_dir = tmp_path / "Qwen2.5-0.5B-Instruct"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "qwen2.5-0.5b-instruct.config.json").read_text())
    arch = resolve_model(str(model_dir / "config.json"))
    assert arch.id == "qwen2.5-0.5b-instruct"
    assert arch.params_total == resolve_model("qwen2.5-0.5b").params_total
    assert arch.weights_bytes_exact is None


def test_model_arch_is_frozen():
    arch = resolve_model("qwen3-8b")
    assert isinstance(arch, ModelArch)
    with pytest.raises(AttributeError):
        arch.num_layers = 1  # type: ignore[misc]


def test_attention_is_named_as_users_name_it():
    from predictor.models import resolve_model

    kinds = {m: resolve_model(m).attention_kind for m in ("llama-2-7b", "codellama-7b", "llama-3-8b", "deepseek-v3")}
    assert kinds == {"llama-2-7b": "mha", "codellama-7b": "mha", "llama-3-8b": "gqa", "deepseek-v3": "mla"}
    assert resolve_model("llama-2-7b").attention == "gqa"  # the layout the formulas read: MHA is GQA of group 1
