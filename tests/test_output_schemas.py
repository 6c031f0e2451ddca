"""Every command's ``--format json`` against its published JSON Schema (benchcal/schema/<command>.schema.json):
numbers are numbers (units in the key names), display strings stay in table / md / html."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from benchcal.cli import main

SCHEMAS = Path(__file__).resolve().parents[1] / "benchcal" / "schema"
RUNS = Path(__file__).resolve().parents[1] / "runs"

CASES = [
    ("predict", ["--model", "llama-3.1-8b", "--gpu", "rtx-4090"]),
    ("predict", ["--model", "qwen2.5-72b", "--gpu", "l4", "--ctx", "32768"]),  # needs offload
    ("predict", ["--model", "llama-3.3-70b", "--gpu", "h100-sxm", "--engine", "vllm", "--quant", "FP8",
                 "--concurrency", "8"]),
    ("predict", ["--model", "qwen2.5-7b", "--gpu", "h100-sxm", "--engine", "vllm", "--request-rate", "2"]),
    ("predict", ["--model", "llama-3.1-8b", "--gpu", "cpu", "--cpu-bw-gbs", "40", "--cpu-tflops", "0.5"]),
    ("leaderboard", ["--model", "qwen2.5-72b", "--quant", "Q4_K_M", "--ctx", "32768"]),
    ("matrix", ["--model", "llama-3.1-8b", "--gpu", "rtx-4090"]),
    ("recommend", ["--model", "llama-3.1-8b", "--ctx", "4096", "--max-ttft-ms", "2000"]),
    ("recommend", ["--model", "deepseek-v3", "--ctx", "8192"]),
    ("models", []),
    ("models", ["--gpu", "rtx-4090", "--ctx", "32768"]),  # every catalogue model on one device
    ("models", ["--gpu", "h100-sxm", "--engine", "vllm", "--quant", "FP8"]),
    ("gpus", []),
    ("finetune", ["--model", "qwen2.5-72b", "--gpu", "h100-sxm"]),
    ("finetune", ["--model", "qwen3-30b-a3b", "--method", "lora", "--gpus", "2"]),
    ("cost", ["--model", "llama-3.3-70b", "--gpu", "rtx-pro-6000", "--concurrency", "4"]),
    ("cost", ["--model", "qwen2.5-7b", "--gpu", "l20"]),
    ("cost", ["--model", "llama-3.1-8b"]),
    ("runs", ["--runs-dir", str(RUNS / "vllm")]),
    ("report", ["--runs-dir", str(RUNS / "vllm")]),
]


@pytest.fixture(scope="module")
def validators():
    out = {}
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text())
        Draft202012Validator.check_schema(schema)
        out[path.name.removesuffix(".schema.json")] = Draft202012Validator(schema)
    return out


def test_every_json_command_has_a_schema(validators):
    assert {command for command, _ in CASES} == set(validators)


@pytest.mark.parametrize("command, args", CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_command_json_matches_its_schema(command, args, validators, capsys):
    assert main([command, *args, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    errors = sorted(validators[command].iter_errors(data), key=lambda e: list(e.absolute_path))
    assert not errors, "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])


def test_a_display_string_where_a_number_belongs_is_refused(validators, capsys):
    assert main(["leaderboard", "--model", "llama-3.1-8b", "--ctx", "4096", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    data["rows"][0]["total_gib"] = "5.4 / 23.5"
    data["rows"][1]["price_usd"] = "$40,000"
    assert len(list(validators["leaderboard"].iter_errors(data))) == 2
