"""Long context: RoPE scaling read from configs, and the scaling a model card documents (Qwen2.5 and Qwen3: YaRN x4
to 131,072 tokens) enabled when a context needs it, with its source, in every report and launch command."""

from __future__ import annotations

import json

import pytest

from benchcal.cli import main
from predictor.architecture import from_hf_config, rope_scaling_from_config
from predictor.estimate import Scenario, predict_scenario
from predictor.models import load_catalogue, load_catalogue_entries, resolve_model
from predictor.scenario import require_context


def test_config_scalings_are_read_and_keep_the_configs_maximum():
    llama = resolve_model("llama-3.1-8b").rope_scaling
    assert (llama.type, llama.factor, llama.original_max_context, llama.max_context, llama.in_config) == (
        "llama3", 8.0, 8192, 131072, True)
    oss = resolve_model("gpt-oss-20b").rope_scaling
    assert (oss.type, oss.factor, oss.original_max_context, oss.max_context) == ("yarn", 32.0, 4096, 131072)
    assert resolve_model("deepseek-v3").rope_scaling.max_context == 163840 == resolve_model("deepseek-v3").max_context
    assert resolve_model("gemma-3-4b").rope_scaling.type == "linear"
    assert resolve_model("llama-3-8b").rope_scaling is None


def test_a_yarn_config_without_a_raised_maximum_reaches_original_times_factor():
    rs = rope_scaling_from_config({"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 32768}}, 32768, "x")
    assert rs.max_context == 131072 and rs.in_config
    assert rope_scaling_from_config({"rope_scaling": {"type": "ntk-by-parts", "factor": 2}}, 4096, "x") is None
    assert rope_scaling_from_config({"rope_scaling": {"type": "yarn", "factor": "big"}}, 4096, "x") is None


def test_catalogue_entries_that_document_long_context_cite_their_card():
    documented = [e for e in load_catalogue_entries() if e.get("long_context")]
    assert {e["id"] for e in documented} >= {"qwen2.5-72b", "qwen2.5-7b", "qwen3-32b", "qwen3-235b-a22b", "qwq-32b"}
    for entry in documented:
        long = entry["long_context"]
        assert long["source"].startswith(f"https://huggingface.co/{entry['hf_id']}")
        arch = resolve_model(entry["id"])
        assert arch.rope_scaling and not arch.rope_scaling.in_config and arch.rope_scaling.note
        assert arch.with_long_context().max_context == long["max_context"] > arch.max_context
    # the small Qwen2.5 models' cards give 32,768 tokens and no YaRN
    assert resolve_model("qwen2.5-0.5b").rope_scaling is None
    assert all(not a.long_context for a in load_catalogue())


def test_a_context_beyond_the_config_enables_the_documented_scaling():
    arch = resolve_model("qwen2.5-72b")
    assert require_context(arch, 32768) is arch
    scaled = require_context(arch, 131072)
    assert scaled.long_context and scaled.max_context == 131072 and scaled.native_max_context == 32768
    at_32k = predict_scenario(Scenario(arch, "h200-sxm", context=32768, prompt_tokens=512), None)
    at_128k = predict_scenario(Scenario(arch, "h200-sxm", context=131072, prompt_tokens=512), None)
    assert at_128k.values["kv_cache_bytes"] == pytest.approx(4 * at_32k.values["kv_cache_bytes"])
    assert at_128k.model.long_context and not at_32k.model.long_context
    rope = at_128k.to_dict()["model"]["rope_scaling"]
    assert rope["enabled"] and rope["factor"] == 4.0 and rope["source"].endswith("#processing-long-texts")
    assert at_32k.to_dict()["model"]["rope_scaling"]["enabled"] is False
    launch = at_128k.launch
    assert "--ctx-size 131072 --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768" in launch["llama_cpp"]
    assert '"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}' in launch["vllm"]
    assert launch["ollama"].startswith("# Ollama has no setting")
    assert "--rope-scaling" not in at_32k.launch["llama_cpp"] and "hf-overrides" not in at_32k.launch["vllm"]


@pytest.mark.parametrize("args,fragment", [
    (["predict", "--model", "qwen2.5-72b", "--gpu", "h200-sxm", "--ctx", "262144"],
     "maximum of 131072 tokens (yarn x4 from 32,768 to 131,072 tokens, as its card documents)"),
    (["predict", "--model", "qwen2.5-0.5b", "--gpu", "h200-sxm", "--ctx", "65536"], "maximum of 32768 tokens"),
    (["matrix", "--model", "qwen3-8b", "--gpu", "rtx-4090", "--contexts", "8192,262144"], "maximum of 131072"),
    (["bench", "--model", "qwen2.5-7b", "--ctx", "65536", "--gpu", "cpu", "--runs-dir", "{tmp}"],
     "bench measures up to the config's maximum"),
])
def test_contexts_beyond_any_scaling_are_refused_in_one_line(args, fragment, tmp_path, capsys):
    assert main([a.replace("{tmp}", str(tmp_path / "runs")) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err
    assert not list(tmp_path.rglob("*.json"))  # nothing measured, nothing stored


def test_reports_say_when_the_scaling_is_on(capsys):
    assert main(["predict", "--model", "qwen3-32b", "--gpu", "h200-sxm", "--ctx", "131072", "--defaults"]) == 0
    out = capsys.readouterr().out
    assert "Long context" in out and "yarn x4 from 32,768 to 131,072 tokens (the config's maximum is 40,960)" in out
    assert "128K" in out  # context scaling goes on to the scaled maximum
    assert main(["leaderboard", "--model", "qwen3-32b", "--ctx", "131072", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"]
    assert main(["matrix", "--model", "qwen3-32b", "--gpu", "rtx-5090", "--contexts", "8192,131072"]) == 0
    assert "Beyond the config's 40,960 tokens: yarn x4" in capsys.readouterr().out


def test_a_config_that_enables_yarn_itself_needs_no_flags():
    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 32768,
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    arch = from_hf_config(cfg, id="tiny", source="config.json")
    assert arch.rope_scaling.in_config and arch.with_long_context() is arch
    assert arch.max_context == 131072  # what vLLM derives: original x factor
    assert require_context(arch, 131072) is arch


def test_a_gguf_that_carries_yarn_metadata_reaches_the_scaled_context(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from predictor.checkpoints import from_gguf

    path = tmp_path / "tiny-qwen2-yarn.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")  # as llama.cpp's converter writes a config's rope_scaling
    for key, value in [("block_count", 2), ("context_length", 32768), ("embedding_length", 32),
                       ("feed_forward_length", 64), ("attention.head_count", 2), ("attention.head_count_kv", 1)]:
        writer.add_uint32(f"qwen2.{key}", value)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(32768)
    writer.add_tensor("token_embd.weight", np.zeros((100, 32), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    arch = from_gguf(path)
    assert arch.rope_scaling.type == "yarn" and arch.rope_scaling.in_config
    assert arch.max_context == 131072 and require_context(arch, 131072) is arch
