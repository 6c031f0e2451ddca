"""The predictor's engine set is defined once (predictor/engines.py) and every module agrees with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import records
from predictor import coefficients, devices, quants
from predictor.engines import ENGINES, TRAITS, traits
from predictor.errors import BenchcalError

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_reads_the_one_engine_set():
    assert coefficients.ENGINES is ENGINES and quants.ENGINES is ENGINES and devices.ENGINES is ENGINES
    assert set(coefficients.ENGINE_DEFAULTS) == set(ENGINES)
    assert set(ENGINES) <= set(records.ENGINES)  # the harness may measure engines the predictor does not describe
    for engine in ENGINES:
        t = traits(engine)
        assert t.name == engine and t.versioned_by in ("build", "version") and t.kv_block_tokens >= 1
        assert quants.resolve_quant(t.default_quant, engine).supports(engine)
        quants.resolve_kv_dtype(t.default_kv_dtype, engine)
    with pytest.raises(BenchcalError):
        traits("sglang")
    assert TRAITS["vllm"].tensor_parallel and not TRAITS["llama.cpp"].tensor_parallel


def test_the_predictor_branches_on_traits_not_on_engine_names():
    found = subprocess.run(["git", "grep", "-nE", r'== "(vllm|llama\.cpp|transformers)"|in \("(vllm|llama\.cpp)"',
                            "--", "predictor", "calibration"], cwd=ROOT, capture_output=True, text=True).stdout
    assert found == "", found
