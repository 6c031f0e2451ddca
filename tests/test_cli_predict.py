"""The prediction commands end to end through ``python -m benchcal``: output contract and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchcal", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_predict_json_is_one_object_with_the_contract():
    p = run("predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--quant", "Q4_K_M", "--ctx", "8192",
            "--format", "json", "--defaults")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["fit"]["verdict"] == "needs offload"
    assert d["gpu"]["id"] == "l4" and d["model"]["id"] == "qwen2.5-72b"
    assert "llama-server" in d["launch"]["llama_cpp"] and "vllm serve" in d["launch"]["vllm"]


def test_predict_table_shows_breakdown_verdict_and_launch_commands():
    p = run("predict", "--model", "Qwen/Qwen2.5-72B-Instruct", "--gpu", "NVIDIA H200", "--ctx", "32768")
    assert p.returncode == 0, p.stderr
    for text in ("KV cache", "10.00 GiB", "Verdict", "fits", "TTFT", "llama-server", "vllm serve"):
        assert text in p.stdout


def test_a_device_without_a_flops_figure_predicts_decode_and_says_why_prefill_is_missing():
    # A device whose FLOPS no source gives (a CPU host whose matmul probe could not run, say): prefill and TTFT
    # cannot be predicted; the reports say so instead of failing, and JSON stays strict (null, never NaN).
    import dataclasses

    from benchcal.reports.predictions import predict_report
    from benchcal.reports.render import render
    from predictor.devices import resolve_device
    from predictor.estimate import predict
    from predictor.models import resolve_model

    spark = resolve_device("dgx-spark")
    unknown = dataclasses.replace(spark, fp16_tflops=None, notes={**spark.notes, "fp16_tflops": "no source"})
    est = predict(resolve_model("llama-3-8b"), unknown, None, 8192, "llama.cpp", coefficients="default")
    for fmt in ("table", "md", "html", "json"):
        text = render(predict_report(est), fmt)
        assert "NaN" not in text and "Infinity" not in text, fmt
    assert "no FLOPS figure" in render(predict_report(est), "table")
    d = json.loads(render(predict_report(est), "json"))
    assert d["throughput"]["prefill_tok_s"] is None and d["throughput"]["decode_tok_s"] > 0
    # without a bandwidth figure not even decode can be predicted, and the report says so
    h20 = resolve_device("h20-141gb")
    no_bandwidth = dataclasses.replace(h20, bandwidth_gbs=None, notes={**h20.notes, "bandwidth_gbs": "no source"})
    est = predict(resolve_model("llama-3-8b"), no_bandwidth, None, 8192, "llama.cpp", coefficients="default")
    assert "no bandwidth figure" in render(predict_report(est), "table")
    assert json.loads(render(predict_report(est), "json"))["throughput"]["decode_tok_s"] is None
    for command in ("leaderboard", "recommend"):
        out = run(command, "--model", "llama-3-8b", "--ctx", "4096", "--format", "json").stdout
        assert "NaN" not in out and "Infinity" not in out, command
        json.loads(out)


def test_html_report_is_self_contained_with_a_chart(tmp_path):
    out = tmp_path / "r.html"
    p = run("predict", "--model", "qwen2.5-72b", "--gpu", "h200", "--format", "html", "--output", str(out))
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "<script" not in page
    assert "Context scaling" in page


@pytest.mark.parametrize("command", [
    ["leaderboard", "--model", "qwen2.5-72b", "--quant", "Q4_K_M", "--ctx", "32768"],
    ["matrix", "--model", "qwen2.5-72b", "--gpu", "l4"],
    ["recommend", "--model", "qwen2.5-72b", "--ctx", "8192", "--min-decode", "5", "--budget", "20000"],
    ["models"],
    ["gpus"],
])
def test_report_commands_run_in_every_format(command):
    for fmt in ("table", "md", "json"):
        p = run(*command, "--format", fmt)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip()
        if fmt == "json":
            json.loads(p.stdout)


@pytest.mark.parametrize("args, fragment", [
    (["predict", "--model", "qwen9-72b", "--gpu", "l4"], "did you mean"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "rtx-9090"], "did you mean"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--ctx", "200000"], "maximum"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--ctx", "0"], "positive"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--batch", "-2"], "positive"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--quant", "AWQ"], "not supported by llama.cpp"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--quant", "Q9_Z"], "unknown"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--engine", "tgi"], "unknown engine"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--ctx", "abc"], "invalid int"),
    (["predict", "--model", "/nonexistent/config.json", "--gpu", "l4"], "nonexistent"),
    (["predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--coefficients", "/nope.json"], "not found"),
    (["leaderboard", "--model", "qwen2.5-72b", "--ctx", "200000"], "maximum"),
    (["matrix", "--model", "qwen2.5-72b", "--gpu", "l4", "--contexts", "4096,x"], "comma-separated"),
    (["recommend", "--model", "qwen2.5-72b", "--ctx", "-5"], "positive"),
    (["recommend", "--model", "qwen2.5-72b", "--ctx", "8192", "--budget", "0"], "positive"),
    # numbers an option cannot mean are refused while parsing, before anything runs
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--host-mem-gib", "inf"], "finite"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--host-bw-gbs", "0"], "positive"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--cpu-bw-gbs", "nan"], "finite"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--offload", "1.5"], "between 0 and 1"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--gpu-memory-utilization", "0"], "above 0"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--prompt", "99999"], "does not fit the context"),
    (["predict", "--model", "qwen2.5-7b", "--gpu", "l4", "--n-ubatch", "-512"], "positive"),
    (["matrix", "--model", "qwen2.5-7b", "--gpu", "l4", "--contexts", ""], "comma-separated"),
    (["matrix", "--model", "qwen2.5-7b", "--gpu", "l4", "--contexts=-1,0"], "--contexts"),
    (["recommend", "--model", "qwen2.5-7b", "--ctx", "8192", "--min-decode", "-5"], "zero or a positive"),
    (["recommend", "--model", "qwen2.5-7b", "--ctx", "8192", "--min-decode", "inf"], "finite"),
    (["calibrate", "--runs-dir", "runs", "--bootstrap", "-1", "--out", "/tmp/never-written"], "zero or a positive"),
    (["runs", "--runs-dir", "/nonexistent/runs"], "no such directory"),
    (["bench", "--model", "smollm2-135m", "--gpu", "cpu", "--timeout", "nan"], "finite"),
    (["bench", "--model", "smollm2-135m", "--gpu", "cpu", "--timeout", "0"], "positive"),
    (["bench", "--model", "smollm2-135m", "--gpu", "cpu", "--reps", "0"], "positive"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, fragment):
    p = run(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert fragment.lower() in lines[0].lower()


def test_malformed_config_names_the_missing_field(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    p = run("predict", "--model", str(cfg), "--gpu", "l4")
    assert p.returncode == 2
    assert "missing field" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_recommend_never_picks_a_device_whose_decode_is_unknown():
    import math

    from benchcal.reports.predictions import recommend_report
    from predictor.models import resolve_model

    arch = resolve_model("qwen2.5-72b")
    for min_decode in (0.0, 20.0, 500.0):
        picks = recommend_report(arch, 8192, min_decode=min_decode).data["picks"]
        for pick in picks:  # the H20 141GB has no bandwidth figure in the catalogue: its decode is unknown
            assert pick["decode_tok_s"] is not None and math.isfinite(pick["decode_tok_s"]), (min_decode, pick)
            assert pick["decode_tok_s"] >= min_decode
    assert recommend_report(arch, 8192, min_decode=500.0).data["picks"] == []


def test_leaderboard_matrix_and_gpus_json_hold_numbers_not_display_strings(capsys):
    from benchcal.cli import main

    assert main(["leaderboard", "--model", "qwen2.5-72b", "--quant", "Q4_K_M", "--ctx", "32768", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    fits = next(r for r in rows if r["status"] == "fits")
    assert isinstance(fits["total_gib"], float) and isinstance(fits["usable_gib"], float)
    assert isinstance(fits["decode_tok_s"], float) and isinstance(fits["max_context"], int)
    assert all(r["price_usd"] is None or isinstance(r["price_usd"], float) for r in rows)
    assert all(r["decode_tok_s"] is None for r in rows if r["status"] == "does not fit")
    assert main(["matrix", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--format", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    cell = row["cells"][0]
    assert isinstance(row["weights_gib"], float) and cell["verdict"] in ("fits", "tight", "needs offload", "does not fit")
    assert isinstance(cell["total_gib"], float) and isinstance(cell["kv_cache_gib"], float)
    assert main(["gpus", "--format", "json"]) == 0
    device = json.loads(capsys.readouterr().out)[0]
    assert isinstance(device["memory_gib"], float) and "price" not in device


def test_an_ollama_command_carries_the_context_flash_attention_and_kv_type():
    from predictor.estimate import predict

    est = predict("qwen2.5-7b", "rtx-4090", "Q4_K_M", 16384, kv_dtype="q8_0", batch=2, coefficients=None)
    command = est.launch["ollama"]
    assert command.startswith("OLLAMA_CONTEXT_LENGTH=16384 OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE=q8_0")
    assert "OLLAMA_NUM_PARALLEL=2" in command
    assert command.endswith("ollama run hf.co/Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M")
    no_fa = predict("qwen2.5-7b", "rtx-4090", "Q4_K_M", 8192, flash_attn=False, coefficients=None)
    assert "OLLAMA_KV_CACHE_TYPE" not in no_fa.launch["ollama"] and "OLLAMA_FLASH_ATTENTION=0" in no_fa.launch["ollama"]
    # a quantized V cache without flash attention is refused, as llama.cpp's context refuses it
    from predictor.errors import BenchcalError

    with pytest.raises(BenchcalError, match="quantized V cache unless flash attention is on"):
        predict("qwen2.5-7b", "rtx-4090", "Q4_K_M", 8192, kv_dtype="q8_0", flash_attn=False, coefficients=None)


def test_the_matrix_decodes_each_cell_at_its_own_context(capsys):
    from benchcal.cli import main

    assert main(["matrix", "--model", "qwen2.5-7b", "--gpu", "rtx-4090", "--contexts", "4096,32768", "--format",
                 "json"]) == 0
    for row in json.loads(capsys.readouterr().out)["rows"]:
        short, long = row["cells"]
        if short["decode_tok_s"] and long["decode_tok_s"]:
            assert long["decode_tok_s"] < short["decode_tok_s"], row["quant"]  # more KV read per token at 32K


def test_leaderboard_offload_rows_carry_the_speed_predict_gives(capsys):
    from benchcal.cli import main

    assert main(["leaderboard", "--model", "qwen2.5-72b", "--quant", "Q4_K_M", "--ctx", "8192", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    row = next(r for r in rows if r["device"] == "rtx-4090")
    assert row["status"] == "needs offload" and row["decode_tok_s"] is None
    assert main(["predict", "--model", "qwen2.5-72b", "--gpu", "rtx-4090", "--quant", "Q4_K_M", "--ctx", "8192",
                 "--prompt", "4096", "--format", "json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert row["offload"]["gpu_layers"] == est["fit"]["max_gpu_layers"]
    assert row["offload"]["decode_tok_s"] == pytest.approx(est["throughput"]["decode_tok_s"], rel=0.01)
    assert row["offload"]["ttft_s"] * 1000 == pytest.approx(est["throughput"]["ttft_ms"], rel=0.01)
    offloaded = [r["offload"]["decode_tok_s"] for r in rows if r["status"] == "needs offload"]
    assert offloaded == sorted(offloaded, reverse=True)  # ordered by the speed that runs


def test_playbook_rows_are_predictions_of_the_changed_configuration():
    p = run("predict", "--model", "qwen2.5-72b", "--gpu", "l4", "--ctx", "32768", "--format", "json")
    d = json.loads(p.stdout)
    rows = {r["change"]: r for r in d["playbook"]}
    kv = d["memory"]["kv_cache_gib"]  # f16, flash attention already on: the saving is the KV cache's alone
    assert rows["q8_0 KV cache"]["saves_gib"] == pytest.approx(kv * (1 - 1.0625 / 2), abs=0.01)
    assert rows["q8_0 KV cache"]["total_gib"] == pytest.approx(d["memory"]["total_gib"] - kv * (1 - 1.0625 / 2), abs=0.01)
    assert rows["flash attention off"]["saves_gib"] < 0  # costs memory
    assert "Q3_K_M weights" in rows  # the model needs offload at Q4_K_M: smaller files are tried


def test_leaderboard_lists_the_fewest_of_a_card_that_hold_the_model():
    d = json.loads(run("leaderboard", "--model", "qwen2.5-72b", "--quant", "Q4_K_M", "--ctx", "32768",
                       "--format", "json").stdout)
    alone = {r["device"]: r["status"] for r in d["rows"]}
    rigs = {r["device"]: r for r in d["rigs"]}
    assert rigs["rtx-5090"]["count"] == 2 and rigs["rtx-4090"]["count"] == 4
    for rig in d["rigs"]:
        assert alone[rig["device"]] not in ("fits", "tight") and rig["status"] in ("fits", "tight")
        assert rig["total_gib"] <= rig["usable_gib"]
    assert "h200-sxm" not in rigs  # it holds the model alone
