"""predictor.gguf_layout: llama-quantize's tensor types, checked against llama.cpp's rules and published files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import synthetic
from predictor import gguf_layout as layout
from predictor.estimate import predict
from predictor.models import load_catalogue, load_catalogue_entries, resolve_model
from predictor.quants import quant_formats, resolve_quant
from predictor.weights import WEIGHTS_FROM_FILE, WEIGHTS_FROM_PLAN, WEIGHTS_FROM_WIDTH, known_weights_bytes

SIZES = Path(__file__).parent / "data" / "gguf-file-sizes" / "published_sizes.json"


def _types(model: str, file_type: str, ffn_width: int | None = None) -> dict[str, str]:
    spec = layout.layout_spec(resolve_model(model), ffn_width)
    return {t.name: t.ggml_type for t in layout.tensor_plan(spec, file_type)}


def test_the_files_a_launch_command_downloads_are_the_ones_sized():
    """Qwen's own Qwen2.5-72B GGUF files pad the FFN to 29,696: planned with that width, each published file is its
    tensors plus the same few MB of metadata, and the prediction sizes that file, not another publisher's."""
    entries = [e for e in load_catalogue_entries() if e.get("gguf", {}).get("files_bytes")]
    assert entries
    for entry in entries:
        arch = resolve_model(entry["id"])
        overheads = {q: size - layout.planned_weights_bytes(arch, q) for q, size in entry["gguf"]["files_bytes"].items()}
        assert all(0 < o < 8e6 for o in overheads.values()), overheads
        assert max(overheads.values()) - min(overheads.values()) < 1e5  # one metadata block, whatever the quant
        est = predict(arch, "l4", "Q4_K_M", 8192, "llama.cpp")
        assert f"-hf {entry['gguf']['repo']}:Q4_K_M" in est.launch["llama_cpp"]
        assert est.values["weights_total_bytes"] == pytest.approx(entry["gguf"]["files_bytes"]["Q4_K_M"], abs=8e6)


def test_launch_commands_name_a_recorded_repository_or_a_local_file():
    """No repository is guessed: the catalogue's GGUF repository, Qwen's own ``-GGUF`` ones, else a local file."""
    for entry in load_catalogue_entries():
        est = predict(entry["id"], "h200", "Q4_K_M", 2048, "llama.cpp")
        command = est.launch["llama_cpp"]
        if entry.get("gguf"):
            assert f"-hf {entry['gguf']['repo']}:Q4_K_M" in command, entry["id"]
        elif entry["hf_id"].startswith("Qwen/"):
            assert f"-hf {entry['hf_id']}-GGUF:Q4_K_M" in command, entry["id"]
        else:
            assert " -m " in command and " -hf " not in command, (entry["id"], command)
            # no AWQ repository recorded: a comment saying what to serve, never a command with a placeholder
            assert est.launch["vllm"].startswith("# vllm serve <a AWQ checkpoint of"), est.launch["vllm"]


def test_every_published_file_size_is_reproduced():
    files = json.loads(SIZES.read_text())["files"]
    assert len(files) >= 200
    for entry in files:
        arch = resolve_model(entry["model"])
        assert known_weights_bytes(arch, resolve_quant(entry["quant"], "llama.cpp"), "llama.cpp")[1] == WEIGHTS_FROM_PLAN
        # a file from another publisher than the repository the launch commands use keeps the config's FFN width
        width = arch.gguf_intermediate_size if entry["repo"] == arch.gguf_repo else arch.intermediate_size
        planned = layout.planned_weights_bytes(arch, entry["quant"], width)
        # The file also holds its metadata (tokenizer: a few MB); the displayed size is rounded.
        assert abs(entry["size_bytes"] - planned) <= 0.01 * entry["size_bytes"] + 8e6, entry
        if entry["model"] == "qwen2.5-72b":  # every K-quant and IQ4_XS mix of the 72B within 0.1%
            assert abs(entry["size_bytes"] - planned) <= 0.001 * entry["size_bytes"], entry


def test_the_plan_is_what_the_synthetic_writer_writes():
    for arch in load_catalogue():
        planned = layout.planned_weights_bytes(arch, "Q4_K_M")
        if planned is not None:
            assert planned == synthetic.weights_bytes(synthetic.resolve_spec(arch.id), "Q4_K_M"), arch.id


def test_file_types_and_block_sizes_agree_with_the_quant_catalogue():
    for qf in quant_formats():
        if qf.id in layout.FILE_TYPES:
            assert layout.FILE_TYPES[qf.id] == (qf.gguf_type, qf.llama_ftype), qf.id
        if qf.id in ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q4_0"):  # the catalogue lists these at the type's width
            values, nbytes = layout.GGML_BLOCKS[qf.gguf_type]
            assert qf.bits_per_weight == pytest.approx(nbytes * 8 / values), qf.id


def test_q4_k_m_rules():
    types = _types("qwen2.5-72b", "Q4_K_M", 29568)  # the config's FFN width, as other publishers convert it
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"  # untied: the mix's own type
    # 80 layers: llama.cpp's 70B type, whose attn_v gets Q5_K where use_more_bits does not give Q6_K.
    assert types["blk.0.attn_v.weight"] == "Q6_K" and types["blk.11.attn_v.weight"] == "Q5_K"
    # ffn_down rows of 29568 values are not a multiple of 256: Q4_K falls back to Q5_0, Q6_K to Q8_0.
    assert types["blk.11.ffn_down.weight"] == "Q5_0" and types["blk.0.ffn_down.weight"] == "Q8_0"
    # Qwen's own files pad it to 29,696: the K-quants apply
    padded = _types("qwen2.5-72b", "Q4_K_M")
    assert padded["blk.11.ffn_down.weight"] == "Q4_K" and padded["blk.0.ffn_down.weight"] == "Q6_K"
    assert types["blk.11.attn_q.weight"] == "Q4_K"
    tied = _types("qwen2.5-0.5b", "Q4_K_M")
    assert tied["token_embd.weight"] == "Q8_0"  # tied: the output's type, Q6_K falling back (896 % 256 != 0)
    assert "output.weight" not in tied


def test_other_mixes():
    llama = _types("llama-3.1-8b", "Q3_K_M")
    assert llama["blk.0.attn_v.weight"] == "Q5_K" and llama["blk.5.attn_v.weight"] == "Q4_K"
    assert llama["blk.0.ffn_down.weight"] == "Q5_K" and llama["blk.5.ffn_down.weight"] == "Q4_K"
    assert llama["blk.5.attn_output.weight"] == "Q4_K" and llama["blk.5.attn_q.weight"] == "Q3_K"
    assert _types("llama-3.1-8b", "Q2_K")["blk.5.attn_v.weight"] == "Q4_K"  # 4 query heads per KV head
    mixtral = _types("mixtral-8x7b", "Q4_K_M")
    assert mixtral["blk.3.attn_v.weight"] == "Q8_0" and mixtral["blk.3.attn_k.weight"] == "Q8_0"
    assert mixtral["blk.3.attn_output.weight"] == "Q5_K"
    f16 = _types("llama-3.1-8b", "F16")
    assert set(f16.values()) == {"F16", "F32"}
    assert layout.planned_weights_bytes(resolve_model("llama-3.1-8b"), "Q4_K_M") == pytest.approx(4.92e9, rel=0.002)


def test_layouts_not_planned_keep_the_average_width():
    for model, quant in (("phi-4", "Q4_K_M"), ("gpt-oss-20b", "Q4_K_M"), ("deepseek-r1", "Q4_K_M"), ("qwen2.5-7b", "UD-Q2_K_XL")):
        assert layout.planned_weights_bytes(resolve_model(model), quant) is None, model
    # A model whose parameters the layout does not hold (e.g. shared experts) is not planned either.
    import dataclasses

    arch = resolve_model("qwen2.5-7b")
    assert layout.planned_weights_bytes(dataclasses.replace(arch, params_total=int(arch.params_total * 1.05)),
                                        "Q4_K_M") is None


def test_predict_says_how_it_sized_the_weights():
    planned = predict("qwen2.5-72b", "h200", "Q4_K_M", 8192, coefficients=None, launch=False)
    assert planned.weights_source == WEIGHTS_FROM_PLAN
    memory = planned.to_dict()["memory"]
    assert memory["weights_source"] == WEIGHTS_FROM_PLAN and memory["weights_exact"] is False
    assert memory["weights_bits_per_weight"] == pytest.approx(4.842, abs=0.002)  # Qwen's own file (padded FFN)
    width = predict("phi-4", "h200", "Q4_K_M", 8192, coefficients=None, launch=False)
    assert width.weights_source == WEIGHTS_FROM_WIDTH
    assert width.to_dict()["memory"]["weights_bits_per_weight"] == resolve_quant("Q4_K_M").bits_per_weight
    gemma = predict("gemma-3-4b", "h200", "Q4_K_M", 8192, coefficients=None, launch=False).to_dict()["memory"]
    # The vision tower (not in the text GGUF) at the file's average width, as without a plan.
    assert gemma["weights_bits_per_weight"] == pytest.approx(
        layout.planned_weights_bytes(resolve_model("gemma-3-4b"), "Q4_K_M") * 8 / (3.88e9), rel=0.002)
    vllm = predict("qwen2.5-7b", "h200", "BF16", 8192, engine="vllm", coefficients=None, launch=False)
    assert vllm.weights_source == WEIGHTS_FROM_WIDTH
    assert WEIGHTS_FROM_FILE == "GGUF file"


def test_imported_llama_bench_model_sizes_match_the_plan():
    """llama-bench's model_size is a file's tensor bytes: the imported runs check the plan to 0.1%."""
    from harness import records

    checked = 0
    for stored in records.iter_records(Path(__file__).parents[1] / "runs"):
        config, provenance = stored.record["config"], stored.record.get("provenance") or {}
        size = provenance.get("weights_bytes")
        if provenance.get("source") != "imported" or config["engine"] != "llama.cpp" or not size:
            continue
        if "qat" in str(provenance.get("imported_from")):
            continue  # Google's quantization-aware Q4_0 file keeps the tied embedding in Q8_0, not Q6_K
        if config["quant"] == "IQ4_XS" and config["model"] == "qwen3-235b-a22b":
            continue  # unsloth's IQ4_XS of Qwen3-235B-A22B-2507 (apple-silicon/): 0.16% above the plan, its own mix
        if "qwen3-coder-30b-a3b-q4_k_m" in str(provenance.get("imported_from")):
            continue  # Qwen3-Coder-30B-A3B's Q4_K_M (amd-r9700/): its own file, 0.42% below the Qwen3-30B-A3B plan
        planned = layout.planned_weights_bytes(resolve_model(config["model"]), config["quant"])
        if planned is None:
            continue
        if "d562" in str(provenance.get("imported_from")):
            # the RTX 5090's meta-llama-3.1-8b-instruct-q4_0.gguf (ik-llama-archive/): 1.370 GB above the Q4_0 plan,
            # its token embedding and output kept in F16 (2 x 128256 x 4096 x 2 bytes against 0.726 GB planned)
            assert abs(size - planned - (2 * 128256 * 4096 * 2 - 725_900_000)) < 0.005 * size
            continue
        rounding = 0.005 * 2**30 if "rounds" in str(provenance.get("weights_bytes_note")) else 0.0
        assert abs(planned - size) <= 0.001 * size + rounding, (config["model"], config["quant"], size, planned)
        checked += 1
    assert checked >= 300


def test_the_quant_matrix_lists_each_file_at_its_own_width_widest_first():
    from benchcal.reports.predictions import matrix_report
    from predictor.devices import resolve_device

    rep = matrix_report(resolve_model("qwen2.5-72b"), resolve_device("h200"), contexts=[4096], table=None)
    rows = rep.data["rows"]
    weights = [row["weights_gib"] for row in rows]
    assert weights == sorted(weights, reverse=True)
    bits = {row["quant"]: row["bits_per_weight"] for row in rows}
    assert bits["Q4_K_M"] == pytest.approx(4.842, abs=0.002)  # Qwen's own file's average, not the format's 4.89
    assert bits["Q3_K_M"] < bits["IQ4_XS"] < bits["Q4_K_M"]


def test_gpt_oss_f16_files_keep_the_mxfp4_experts():
    """Published F16 GGUFs of gpt-oss-20b (unsloth, DevQuasar: 13.8 GB) hold MXFP4 experts and 16-bit other
    weights; an average of 16 bits over all 20.9B parameters would be 41.8 GB."""
    from predictor.weights import WEIGHTS_FROM_NATIVE_EXPERTS, format_bits

    entries = [e for e in json.loads(SIZES.read_text())["left_out"]
               if e["model"] == "gpt-oss-20b" and e["quant"] == "F16"]
    assert {e["repo"] for e in entries} == {"unsloth/gpt-oss-20b-GGUF", "DevQuasar/openai.gpt-oss-20b-GGUF"}
    arch = resolve_model("gpt-oss-20b")
    for quant in ("F16", "BF16"):
        size, source = known_weights_bytes(arch, resolve_quant(quant, "llama.cpp"), "llama.cpp")
        assert source == WEIGHTS_FROM_NATIVE_EXPERTS
        for entry in entries:
            assert abs(entry["size_bytes"] - size) <= 0.01 * entry["size_bytes"] + 8e6, entry
    assert format_bits(arch, resolve_quant("F16", "llama.cpp"), "llama.cpp") == (4.25, 16.0)
    # Quantized mixes and vLLM keep the format's width; a dense model is untouched.
    assert known_weights_bytes(arch, resolve_quant("Q4_K_M", "llama.cpp"), "llama.cpp")[1] == "average width"
    assert format_bits(arch, resolve_quant("BF16", "vllm"), "vllm") == (16.0, None)
    assert resolve_model("llama-3-8b").expert_format is None
