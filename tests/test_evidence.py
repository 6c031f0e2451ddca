"""How far a prediction's evidence reaches (predictor.evidence), on the shipped table: a measured, a family, a prior
and an extrapolated device, the band at each level, and the reports that name it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from predictor.coefficients import default_coefficients_path, load_coefficients
from predictor.estimate import predict
from predictor.evidence import admits, format_family

ROOT = Path(__file__).resolve().parents[1]
TABLE = load_coefficients(default_coefficients_path())  # the shipped table (read-only)


def _evidence(*args, **kwargs):
    est = predict(*args, coefficients=TABLE, **kwargs)
    cal = est.to_dict()["calibration"]
    return cal["evidence"]["level"], cal["evidence"]["basis"], cal["error_band"], cal["scope"]


def test_format_families():
    assert [format_family(q) for q in ("F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "UD-Q2_K_XL", "IQ4_XS",
                                       "MXFP4", "FP8", "AWQ", "GPTQ")] == [
        "float", "float", "legacy", "legacy", "k-quant", "k-quant", "k-quant", "i-quant", "mxfp4", "fp8", "int4",
        "int4"]


def test_a_device_measured_on_its_backend_in_the_format_family_is_measured():
    level, basis, band, scope = _evidence("llama-3-8b", "rtx-4090", "Q4_K_M")
    assert (level, scope) == ("measured", "device:rtx-4090") and "CUDA" in basis and "k-quant" in basis
    assert band == TABLE.table["engines"]["llama.cpp"]["devices"]["rtx-4090"]["error_band"]  # the scope's own CV


def test_a_family_or_another_format_family_of_the_device_is_family_with_the_device_held_out_band():
    lodo = {q: v["p90"] for q, v in TABLE.table["cross_validation"]["lodo"]["kinds"]["gpu"].items() if v["p90"]}
    level, basis, band, scope = _evidence("llama-3-8b", "rtx-3060-12gb", "Q4_K_M")
    assert (level, scope) == ("family", "family:gddr6/ampere")
    assert all(band[q] >= lodo[q] for q in ("decode", "prefill"))
    level, basis, _band, _scope = _evidence("llama-3-8b", "rtx-4090", "IQ4_XS")  # the device, not the format
    assert level == "family" and "not i-quant" in basis


def test_a_device_nobody_measured_takes_the_prior_on_a_measured_backend_else_is_extrapolated():
    level, _basis, band, scope = _evidence("llama-3-8b", "h200-sxm", "Q4_K_M")
    assert (level, scope) == ("prior", "prior:physics/gpu")
    # the discrete GPUs' prior is fitted on CUDA's devices: an MI325X (ROCm) takes none and is extrapolated, with the
    # defaults' wide band
    level, basis, wide, scope = _evidence("llama-3-8b", "mi325x", "Q4_K_M")
    assert (level, scope) == ("extrapolated", "engine") and "CUDA's kernels, not ROCm's" in basis
    # a device whose two runs identify nothing: the prior's values where it takes them, else extrapolated
    level, basis, _band, scope = _evidence("llama-2-7b", "gh200", "Q4_K_M", 4096)
    assert (level, scope) == ("prior", "device:gh200") and "too few to identify" in basis
    level, basis, _band, scope = _evidence("llama-2-7b", "mi300x", "Q4_0", 4096)
    assert (level, scope) == ("extrapolated", "device:mi300x") and "too few to identify" in basis
    defaults = TABLE.table["default_error_band"]["gpu"]
    assert wide["decode"] >= defaults["decode"] > 2 * band["decode"]
    # a measured device on a backend none of its runs used, and vLLM on a GPU (no vLLM GPU run in the table)
    from predictor.estimate import predict_scenario
    from predictor.scenario import Scenario

    vulkan = predict_scenario(Scenario("llama-3-8b", "rtx-4090", quant="Q4_K_M", backend="Vulkan"), TABLE)
    assert vulkan.to_dict()["calibration"]["evidence"]["level"] == "extrapolated"
    # vLLM on a GPU nobody measured (its GPU runs are an A100's): the engine average, no physics prior
    level, basis, _band, scope = _evidence("llama-3.1-8b", "h100-sxm", "BF16", engine="vllm")
    assert (level, scope) == ("extrapolated", "engine") and "no run of this device or its family" in basis
    level, basis, _band, scope = _evidence("qwen2.5-7b", "a100-sxm-80gb", "BF16", engine="vllm")
    assert (level, scope) == ("measured", "device:a100-sxm-80gb")


def test_the_levels_admit_what_is_above_them():
    assert admits("measured", "measured") and not admits("family", "measured")
    assert admits("prior", "prior") and not admits("extrapolated", "prior") and admits("extrapolated", "any")


def test_the_shipped_index_is_what_calibrate_writes_for_the_shipped_runs():
    from calibration.dataset import load_dataset
    from calibration.table import evidence_index

    dataset = load_dataset([str(ROOT / "runs")])
    for engine, eng in TABLE.table["engines"].items():
        assert eng["evidence"] == json.loads(json.dumps(evidence_index(dataset, engine))), engine


def _json(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchcal", *args, "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_leaderboard_matrix_and_recommend_name_the_evidence_and_recommend_filters_on_it():
    rows = {r["device"]: r["evidence"] for r in _json("leaderboard", "--model", "llama-3-8b", "--quant", "Q4_K_M")["rows"]}
    assert rows["rtx-4090"]["level"] == "measured" and rows["mi300x"]["level"] == "extrapolated"
    assert rows["mi300x"]["band"]["decode"] > rows["rtx-4090"]["band"]["decode"]
    matrix = {r["quant"]: r["evidence"]["level"] for r in _json("matrix", "--model", "llama-3-8b", "--gpu",
                                                                  "rtx-4090")["rows"]}
    assert matrix["Q4_K_M"] == "measured" and matrix["IQ4_XS"] == "family"
    anything = _json("recommend", "--model", "llama-3.1-70b", "--quant", "Q4_K_M")["picks"]
    measured = _json("recommend", "--model", "llama-3.1-70b", "--quant", "Q4_K_M", "--evidence", "measured")["picks"]
    assert any(p["evidence"]["level"] == "extrapolated" for p in anything)
    assert measured and all(p["evidence"]["level"] == "measured" for p in measured)
    text = subprocess.run([sys.executable, "-m", "benchcal", "leaderboard", "--model", "llama-3-8b", "--quant",
                           "Q4_K_M"], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "Evidence (decode band)" in text and "extrapolated (±" in text


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_the_predict_report_names_its_evidence(fmt):
    done = subprocess.run([sys.executable, "-m", "benchcal", "predict", "--model", "llama-3-8b", "--gpu", "mi300x",
                           "--format", fmt], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Evidence" in done.stdout and "extrapolated" in done.stdout


def test_the_discrete_gpus_prior_is_fitted_on_one_backends_devices():
    """A prior describes one backend's kernels: the discrete GPUs' is CUDA's, fitted on NVIDIA devices only, though
    AMD GPUs (an R9700, an MI300X on ROCm) have device scopes of their own."""
    from predictor.devices import resolve_device

    eng = TABLE.table["engines"]["llama.cpp"]
    gpu = eng["physics"]["kinds"]["gpu"]
    assert gpu["backend"] == "CUDA"
    fitted = set(gpu["decode_bw_efficiency"]["all"]["devices"]) | set(gpu["prefill_compute_efficiency"]["devices"])
    assert fitted and {resolve_device(d).vendor for d in fitted} == {"nvidia"}
    assert {"radeon-ai-pro-r9700", "mi300x"} <= set(eng["devices"])


def test_a_quantity_the_device_runs_did_not_fit_says_so_with_the_wider_band():
    # the R9700's decode runs are fitted, its ROCm prefill runs kept out: measured, prefill at the extrapolated band
    level, basis, band, scope = _evidence("llama-2-7b", "radeon-ai-pro-r9700", "Q4_0", 4096)
    assert (level, scope) == ("measured", "device:radeon-ai-pro-r9700") and "prefill: no run of this device" in basis
    wide = TABLE.table["default_error_band"]["gpu"]
    own = TABLE.table["engines"]["llama.cpp"]["devices"]["radeon-ai-pro-r9700"]["error_band"]
    assert band["decode"] == own["decode"] and band["prefill"] >= wide["prefill"]
    # two decode runs that identify nothing take their family's values, and its level
    level, basis, _band, scope = _evidence("llama-3-8b", "rtx-5080", "Q4_K_M", 4096)
    assert (level, scope) == ("family", "device:rtx-5080") and "its family's values" in basis
