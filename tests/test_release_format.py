"""A model's default weights format is the one its release ships in, the same in every command that picks one."""

from __future__ import annotations

import json

from predictor.estimate import predict
from predictor.models import resolve_model
from predictor.quants import default_format


def test_the_release_format_comes_from_the_checkpoints_quantization_config():
    assert resolve_model("gpt-oss-120b").release_format == "MXFP4"  # quant_method mxfp4
    assert resolve_model("deepseek-v3").release_format == "FP8"  # quant_method fp8
    assert resolve_model("llama-3.1-8b").release_format is None  # a BF16 release
    assert default_format(resolve_model("gpt-oss-20b"), "llama.cpp") == "MXFP4"
    assert default_format(resolve_model("gpt-oss-20b"), "vllm") == "MXFP4"
    assert default_format(resolve_model("deepseek-v3"), "vllm") == "FP8"
    assert default_format(resolve_model("deepseek-v3"), "llama.cpp") == "Q4_K_M"  # no FP8 GGUF: the engine's default
    assert default_format(resolve_model("llama-3.1-8b"), "vllm", "AWQ") == "AWQ"


def test_predict_sizes_gpt_oss_as_it_ships_and_names_a_real_checkpoint():
    est = predict("gpt-oss-120b", "h100-sxm", None, 8192, engine="vllm", coefficients=None)
    assert est.quant.id == "MXFP4" and 55 < est.values["weights_bytes"] / 2**30 < 65  # ~60 GiB, not Q4_K_M's 66
    launch = est.to_dict()["launch"]
    assert launch["vllm"].startswith("vllm serve openai/gpt-oss-120b ") and "<" not in launch["vllm"]
    assert "gpt-oss-120b-MXFP4.gguf" in launch["llama_cpp"]


def test_every_command_that_picks_a_format_picks_the_same_one(capsys):
    from benchcal.cli import main

    for argv in (["predict", "--gpu", "rtx-4090"], ["leaderboard"], ["recommend"], ["cost", "--gpu", "rtx-4090"]):
        assert main([*argv, "--model", "gpt-oss-20b", "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["quant"] == "MXFP4", argv[0]


def test_vllm_takes_the_same_default_format_in_predict_and_the_leaderboard(capsys):
    # a BF16 release: BF16 in predict, leaderboard, recommend and cost alike (the leaderboard once took AWQ)
    from benchcal.cli import main

    for argv in (["predict", "--gpu", "h100-sxm"], ["leaderboard"], ["recommend"], ["cost", "--gpu", "h100-sxm"]):
        assert main([*argv, "--model", "llama-3.1-8b", "--engine", "vllm", "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["quant"] == "BF16", argv[0]
