"""Every engine the harness measures is one package under harness/engines/, registered once."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness import records
from harness.engines import ENGINE_CLASSES, ENGINE_PACKAGES, ENGINES, engine_setup
from harness.engines.base import Engine, engine_class
from harness.engines.setup import EngineSetup
from predictor.errors import BenchcalError

ENGINES_DIR = Path(__file__).resolve().parents[1] / "harness" / "engines"


@pytest.mark.parametrize("name", ENGINES)
def test_every_registered_engine_is_a_package_with_setup_engine_and_logparse(name):
    package, cls = ENGINE_PACKAGES[name]
    for module in ("setup", "engine", "logparse"):
        assert (ENGINES_DIR / package / f"{module}.py").is_file(), f"{package}/{module}.py"
    setup = engine_setup(name)
    assert isinstance(setup, EngineSetup) and setup.name == name
    engine = engine_class(name)
    assert issubclass(engine, Engine) and engine.__name__ == cls and engine.name == name
    logparse = importlib.import_module(f"harness.engines.{package}.logparse")
    assert any(isinstance(v, tuple) and k.endswith("OOM_PATTERNS") for k, v in vars(logparse).items())


def test_the_engine_set_is_defined_once():
    assert records.ENGINES is ENGINES
    assert set(ENGINE_CLASSES) == set(ENGINES)
    packages = {p.name for p in ENGINES_DIR.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == {package for package, _ in ENGINE_PACKAGES.values()}


def test_an_unknown_engine_is_refused_with_a_suggestion():
    with pytest.raises(BenchcalError, match="did you mean: vllm"):
        engine_setup("vlm")


def test_engine_setups_say_how_runs_are_planned():
    assert engine_setup("llama.cpp").replans_offload and engine_setup("llama.cpp").default_quant == "Q4_K_M"
    assert not engine_setup("vllm").replans_offload and engine_setup("vllm").default_quant is None
