"""Calibration commands on bad input: one line on stderr and exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchcal.cli import main

DATA = Path(__file__).parent / "data" / "imported"


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--runs-dir", "{tmp}/missing"], "runs directory not found"),
    (["calibrate", "--runs-dir", "{tmp}"], "no run records"),
    (["report", "--runs-dir", "{tmp}/missing"], "runs directory not found"),
    (["report", "--runs-dir", "{tmp}", "--coefficients", "{tmp}/missing.json"], "coefficients file not found"),
    (["check", "--runs-dir", "{tmp}", "--thresholds", "{tmp}/missing.toml"], "thresholds file not found"),
    (["import", "llama-bench", "{tmp}/missing.md", "--model", "llama-3-8b"], "file not found"),
    (["import", "llama-bench", str(DATA / "llama-bench-readme" / "rtx4080-qwen2.5-7b-q4_k_m.json"), "--model",
      "llama-9-999b", "--runs-dir", "{tmp}/runs"], "unknown model"),
    (["import", "llama-bench", str(DATA / "llama-bench-readme" / "rtx4080-qwen2.5-7b-q4_k_m.json"), "--model",
      "qwen2.5-7b", "--gpu", "rtx-9999", "--runs-dir", "{tmp}/runs"], "unknown GPU"),
    (["import", "vllm-bench", "{tmp}/missing.json", "--model", "llama-3.2-3b", "--gpu", "l40s"], "file not found"),
    (["import"], "import needs a kind"),
])
def test_bad_input_exits_2_with_one_line(argv, message, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("benchcal: error:") and message in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["calibrate", "report", "check", "import"])
def test_every_command_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "example" in capsys.readouterr().out
