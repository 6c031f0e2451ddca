"""The security promises of docs/security.md that need no engine: a model's own code only by an explicit flag."""

from __future__ import annotations

import pytest

from harness.runconfig import permit_remote_code, prepare_config
from predictor.errors import BenchcalError

VLLM = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "context": 512, "prompt_tokens": [16],
        "arch_overrides": {"num_layers": 2, "vocab_size": 4096}}


def test_trust_remote_code_in_a_config_is_refused_without_the_command_line_flag():
    permit_remote_code(False)
    with pytest.raises(BenchcalError, match="pass --trust-remote-code"):
        prepare_config({**VLLM, "engine_options": {"trust_remote_code": True}})
    try:
        permit_remote_code(True)
        cfg = prepare_config({**VLLM, "engine_options": {"trust_remote_code": True}})
        assert cfg["engine_options"]["trust_remote_code"] is True
    finally:
        permit_remote_code(False)
    assert prepare_config(VLLM)["engine_options"].get("trust_remote_code") in (None, False)


def test_a_sweep_cannot_turn_it_on_and_the_cli_refuses_it_with_exit_2(tmp_path, capsys):
    from benchcal.cli import main

    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "x"\n[[configs]]\nmodel = "qwen2.5-0.5b"\nengine = "vllm"\ndevice = "cpu"\n'
                     'engine_options = { trust_remote_code = true }\n')
    assert main(["bench", "--gpu", "cpu", "--sweep", str(sweep), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "pass --trust-remote-code" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))
