"""Engine options are checked against what each engine reads: a misspelt key is refused, not measured as the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import runconfig, sweep
from predictor.errors import BenchcalError

SWEEPS = sorted((Path(__file__).resolve().parents[1] / "harness" / "sweeps").glob("*.toml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_uses_only_options_its_engines_read(path, monkeypatch):
    monkeypatch.setattr(runconfig, "_REMOTE_CODE_PERMITTED", True)
    for config in sweep.load_sweep(str(path)).configs:
        runconfig.prepare_config({"device": "cpu", **config})


def test_an_option_the_engine_does_not_read_is_refused_with_the_nearest_name():
    base = {"engine": "llama.cpp", "model": "smollm2-135m", "quant": "Q4_0", "device": "cpu", "context": 512}
    with pytest.raises(BenchcalError, match=r"unknown engine option 'thread' for llama.cpp \(did you mean: threads"):
        runconfig.prepare_config({**base, "engine_options": {"thread": 1}})
    with pytest.raises(BenchcalError, match="kv_pool"):  # vLLM's, not llama.cpp's
        runconfig.prepare_config({**base, "engine_options": {"kv_pool": "profiled"}})
    assert runconfig.prepare_config({**base, "engine_options": {"threads": 1, "n_ubatch": 64}})["engine_options"]


@pytest.mark.parametrize("engine,model", [("llama.cpp", "smollm2-135m"), ("vllm", "qwen2.5-0.5b"),
                                          ("transformers", "qwen2.5-0.5b")])
def test_what_bench_itself_sets_is_accepted_for_every_engine(engine, model):
    from benchcal.cli import build_parser
    from benchcal.commands.bench import config_from_args

    args = build_parser().parse_args(["bench", "--gpu", "cpu", "--engine", engine, "--model", model,
                                      "--threads", "1", "--quant", "BF16" if engine != "llama.cpp" else "Q4_0"])
    runconfig.prepare_config(config_from_args(args, "cpu"))
