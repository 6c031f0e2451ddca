"""Engine build eras: the catalogue, a run's era, the era overlay of a coefficient table, predict --engine-build."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchcal.cli import main
from calibration.dataset import load_dataset
from calibration.overlays import fit_era_overlays
from calibration.table import fit_table
from predictor.coefficients import Coefficients
from predictor.engines import ENGINES
from predictor.eras import build_number, era_for_build, era_terms, eras, run_era
from predictor.errors import BenchcalError
from predictor.estimate import predict

RUNS = "runs"


def test_every_era_names_what_marks_it_and_how_its_boundary_was_placed():
    for engine in ENGINES:
        found = eras(engine)
        assert found, engine
        for era in found:
            assert era.marked_by and era.boundary_basis and era.label, era
        for older, newer in zip(found, found[1:]):
            assert older.end == newer.start  # contiguous, oldest first
        assert found[-1].end is None  # the newest era is open
    assert set(era_terms("llama.cpp")) <= {"decode_fixed_ms", "decode_fixed_per_layer_us", "decode_moe_per_layer_us",
                                           "prefill_fixed_ms", "prefill_compute_efficiency"}
    assert era_terms("vllm") == ()


def test_a_runs_build_comes_from_its_version_or_from_the_commit_llama_cpp_python_vendors():
    assert build_number("llama.cpp build 2824 (4426e298)") == 2824
    assert build_number("llama-cpp-python 0.3.36 (libllama 0.5.0-dev)", "0c1e57098") == 11312
    assert build_number("llama-cpp-python 0.3.36 (libllama 0.5.0-dev)", "deadbeef1") is None
    assert run_era("llama.cpp", "llama.cpp build 2824 (4426e298)") == "2024"
    assert run_era("llama.cpp", "llama.cpp build 7474 (f9ec8858e)") == "2025"
    assert run_era("llama.cpp", "llama-cpp-python 0.3.36", "0c1e57098") == "2025"
    assert run_era("vllm", "0.32.0") == "v1" and run_era("vllm", "0.6.3") == "v0"
    assert run_era("llama.cpp", None) is None


def test_a_build_on_the_command_line_is_validated():
    assert era_for_build("llama.cpp", "b7474").id == "2025" and era_for_build("llama.cpp", 2800).id == "2024"
    assert era_for_build("vllm", "0.10.1").id == "v1"
    for engine, bad in (("llama.cpp", "latest"), ("llama.cpp", "b12x"), ("vllm", "new")):
        with pytest.raises(BenchcalError):
            era_for_build(engine, bad)


def _entry(value: float, era: str) -> dict:
    return {"value": value, "identified": True, "eras": [era]}


TABLE = {"schema_version": 1, "engines": {"llama.cpp": {
    "default": {"decode_fixed_per_layer_us": {"value": 115.0, "identified": True, "eras": ["2024", "2025"]},
                "decode_bw_efficiency": {"value": 0.9, "identified": True, "eras": ["2024", "2025"]}},
    "families": {},
    "devices": {"old-gpu": {"decode_fixed_per_layer_us": _entry(120.0, "2024"),
                            "decode_bw_efficiency": _entry(0.8, "2024")},
                "new-gpu": {"decode_fixed_per_layer_us": _entry(20.0, "2025")}},
    "eras": {"2025": {"label": "builds from 3000", "kinds": {"gpu": {
        "decode_fixed_per_layer_us": {"value": 30.0, "identified": True},
        "decode_bw_efficiency": {"value": 0.1, "identified": True}}}}},  # not an era term: never applied
}}}


def test_an_era_overlay_replaces_era_terms_fitted_on_other_builds_only():
    table = Coefficients(TABLE)
    pooled = table.lookup("llama.cpp", "old-gpu", "x")
    assert pooled["decode_fixed_per_layer_us"] == 120.0 and pooled.era is None
    old = table.lookup("llama.cpp", "old-gpu", "x", "2025", "gpu")  # measured on 2024 builds only
    assert old["decode_fixed_per_layer_us"] == 30.0 and old.origin["decode_fixed_per_layer_us"] == "era:2025/gpu"
    assert old["decode_bw_efficiency"] == 0.8  # a device property: the device's own
    assert old.era == "2025"
    new = table.lookup("llama.cpp", "new-gpu", "x", "2025", "gpu")  # measured on 2025 builds alone: its own
    assert new["decode_fixed_per_layer_us"] == 20.0 and new.era is None
    unmeasured = table.lookup("llama.cpp", "other", "x", "2025", "gpu")  # engine scope mixes eras: replaced
    assert unmeasured["decode_fixed_per_layer_us"] == 30.0
    assert table.lookup("llama.cpp", "other", "x", "2025", "unified")["decode_fixed_per_layer_us"] == 115.0
    assert table.newest_era("llama.cpp", "gpu") == "2025" and table.newest_era("llama.cpp", "cpu") is None


def test_gpus_that_never_run_cuda_graphs_take_no_era_overlay():
    from predictor.devices import resolve_device
    from predictor.eras import era_applies, no_era_architectures

    assert {"volta", "turing"} <= no_era_architectures("llama.cpp") and not no_era_architectures("vllm")
    assert not era_applies("llama.cpp", resolve_device("v100-pcie-16gb"))
    assert era_applies("llama.cpp", resolve_device("rtx-3090")) and era_applies("llama.cpp", None)
    table = Coefficients(TABLE)
    v100 = table.lookup("llama.cpp", "other", "x", "2025", "gpu", resolve_device("v100-pcie-16gb"))
    assert v100["decode_fixed_per_layer_us"] == 115.0 and v100.era is None  # the pooled value, no overlay
    assert table.lookup("llama.cpp", "other", "x", "2025", "gpu",
                        resolve_device("rtx-3090"))["decode_fixed_per_layer_us"] == 30.0
    from predictor.eras import era_description

    note = era_description("llama.cpp", "gpu", "2025", None, v100, overlay=True, device=resolve_device("v100-pcie-16gb"))
    assert not note["applied"] and "runs no CUDA graphs" in note["note"]


def test_predict_says_which_era_it_used(tmp_path):
    table = Coefficients(TABLE)
    newest = predict("llama-3-8b", "rtx-4090", "Q4_K_M", 4096, coefficients=table, launch=False)
    assert newest.era["id"] == "2025" and newest.era["applied"]
    assert newest.coefficients["decode_fixed_per_layer_us"] == 30.0
    old = predict("llama-3-8b", "rtx-4090", "Q4_K_M", 4096, coefficients=table, launch=False, engine_build=2824)
    assert old.era["id"] == "2024" and not old.era["applied"] and "no values fitted for this era" in old.era["note"]
    assert old.coefficients["decode_fixed_per_layer_us"] == 115.0
    assert newest.values["decode_tok_s"] > old.values["decode_tok_s"]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(TABLE))
    out = tmp_path / "out.json"
    assert main(["predict", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--ctx", "4096", "--coefficients", str(path),
                 "--engine-build", "b7474", "--format", "json", "--output", str(out)]) == 0
    era = json.loads(out.read_text())["calibration"]["era"]
    assert era["id"] == "2025" and era["build"] == "b7474" and era["applied"]


def test_a_bad_engine_build_is_refused_before_anything_runs(capsys):
    assert main(["predict", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--engine-build", "newest"]) == 2
    assert "not a llama.cpp build number" in capsys.readouterr().err


def test_era_values_are_kept_only_where_they_bring_the_eras_runs_closer():
    # where devices were measured on this era's builds and on others, the test is theirs: their runs of this era,
    # predicted from their other runs alone, with and without the era's values; else the era's runs in-sample
    dataset = load_dataset([RUNS])
    table = fit_table(dataset)
    overlays, checks = fit_era_overlays(dataset, table, "llama.cpp")
    assert checks, "the shipped runs span two eras on GPUs and unified-memory chips"
    assert {c["kind"] for c in checks} <= {"gpu", "unified", "cpu"}
    for check in checks:
        if "cross_era_with" in check:  # devices measured on this era's builds and others': predicted across eras
            assert check["kept"] == (check["cross_era_with"] < check["cross_era_without"])
            assert check["cross_era_devices"] and set(check["cross_era_devices"]) <= set(check["devices"])
        else:
            assert check["kept"] == (check["era_mape"] < check["fallback_mape"])
        assert len(check["devices"]) >= 3
        kept = ((overlays.get(check["era"]) or {}).get("kinds") or {}).get(check["kind"]) or {}
        fitted = [v for v in kept.values() if isinstance(v, dict) and v.get("quantity") == check["quantity"]]
        assert bool(fitted) == check["kept"]
    era = dataset.blocks["decode"].meta["era"]
    assert set(era.dropna()) <= {"2024", "2025", "v0", "v1"} and np.mean(era.notna()) > 0.9


def test_a_value_held_at_its_parents_is_not_the_eras_own():
    """A scope of one era's runs keeps what it fitted; what it could not identify (held at the pooled parent value)
    takes the era's value, and the prediction says which happened."""
    table = json.loads(json.dumps(TABLE))
    table["engines"]["llama.cpp"]["devices"]["new-gpu"]["decode_bw_efficiency"] = {
        "value": 0.9, "identified": False, "eras": ["2025"]}
    table["engines"]["llama.cpp"]["eras"]["2025"]["kinds"]["gpu"]["decode_bw_efficiency"]["value"] = 0.1
    coefficients = Coefficients(table)
    new = coefficients.lookup("llama.cpp", "new-gpu", "x", "2025", "gpu")
    assert new["decode_fixed_per_layer_us"] == 20.0  # fitted on the era's runs alone: its own
    assert new["decode_bw_efficiency"] == 0.9  # not an era term: never replaced
    held = json.loads(json.dumps(TABLE))
    held["engines"]["llama.cpp"]["devices"]["new-gpu"]["decode_fixed_per_layer_us"]["identified"] = False
    assert Coefficients(held).lookup("llama.cpp", "new-gpu", "x", "2025", "gpu")["decode_fixed_per_layer_us"] == 30.0


def test_a_scope_fitted_on_its_eras_runs_alone_says_so(tmp_path):
    from predictor.eras import era_description

    cset = Coefficients(TABLE).lookup("llama.cpp", "new-gpu", "x", "2025", "gpu")
    note = era_description("llama.cpp", "gpu", "2025", None, cset, overlay=True)
    assert not note["applied"] and "fitted on that era's runs alone" in note["note"]
    assert "no values fitted" in era_description("llama.cpp", "gpu", "2025", None, cset)["note"]


def test_the_shipped_table_starts_a_scope_of_one_eras_runs_from_that_eras_values():
    from predictor.coefficients import default_coefficients_path

    table = json.loads(default_coefficients_path().read_text())
    eng = table["engines"]["llama.cpp"]
    overlay = eng["eras"]["2025"]["kinds"]["gpu"]
    scope = eng["devices"]["rtx-pro-6000"]  # three runs, all of build 6413
    kept = [name for name, item in overlay.items() if isinstance(item, dict) and "value" in item]
    assert kept
    for name in kept:  # what its runs could not identify starts from the era's values, not the pooled ones
        if not scope[name]["identified"]:
            assert scope[name]["value"] == overlay[name]["value"]
    assert any(not scope[name]["identified"] for name in kept)


def test_a_build_of_the_cublas_era_prices_quantized_prefill_as_the_fit_priced_its_runs():
    # XiongjieDai's RTX 4090 run of Llama-3-8B Q4_K_M, build 2824: its log says CUDA_USE_TENSOR_CORES: yes, so the
    # calibration prices its prompt's matmuls through an FP16 copy of the weights; predict --engine-build 2824 does too
    from calibration.dataset import predict as predict_rows
    from predictor.coefficients import default_coefficients

    dataset = load_dataset([RUNS])
    rows = dataset.blocks["prefill"].meta
    i = int(np.flatnonzero(((rows["source_set"] == "llama3-gpu-benchmarks") & (rows["device_id"] == "rtx-4090")
                            & (rows["quant"] == "Q4_K_M") & (rows["prompt_tokens"] == 512)).to_numpy())[0])
    assert rows.iloc[i]["quantized_matmul"] == "cublas-fp16"
    fitted = predict_rows(dataset, default_coefficients())["prefill"][i]
    old = predict("llama-3-8b", "rtx-4090", "Q4_K_M", 512, prompt_tokens=512, flash_attn=False, engine_build=2824,
                  launch=False)
    assert old.values["prefill_s"] == pytest.approx(fitted, rel=1e-9)
    assert old.era["quantized_prefill"] == "cublas-fp16" and "cuBLAS" in old.era["note"]
    # NVIDIA GPUs alone took that path, and current builds (MMQ) make no copy
    newest = predict("llama-3-8b", "rtx-4090", "Q4_K_M", 512, prompt_tokens=512, flash_attn=False, launch=False)
    assert "quantized_prefill" not in newest.era
    for device in ("rx-7900-xtx", "mac-studio-m2-ultra-192gb"):
        other = predict("llama-3-8b", device, "Q4_K_M", 512, prompt_tokens=512, flash_attn=False, engine_build=2824,
                        launch=False)
        assert "quantized_prefill" not in other.era
