"""A user's runs and fits live in their own data directory; predict reads their devices first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from predictor.coefficients import (
    Coefficients,
    default_coefficients,
    default_coefficients_path,
    load_coefficients,
)
from predictor.userdata import benchcal_home, is_shipped, user_calibration_dir, user_runs_dir

ROOT = Path(__file__).resolve().parents[1]
HOST = "cpu-test-avx2-2c"


def _user_table(values: dict[str, float]) -> dict:
    return {"schema_version": 1, "source": "benchcal calibrate --runs-dir mine", "engines": {"llama.cpp": {
        "default": {}, "families": {"dram/cpu": {"decode_bw_efficiency": {"value": 0.01}}},
        "devices": {HOST: {name: {"value": v} for name, v in values.items()}}}}}


def test_the_home_directory_holds_runs_and_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path))
    assert benchcal_home() == tmp_path
    assert user_runs_dir() == tmp_path / "runs" and user_calibration_dir() == tmp_path / "calibration"
    monkeypatch.setenv("BENCHCAL_RUNS", str(tmp_path / "elsewhere"))
    assert user_runs_dir() == tmp_path / "elsewhere"
    assert is_shipped(ROOT / "runs") and is_shipped(ROOT / "calibration" / "coefficients.json")
    assert not is_shipped(tmp_path)


def test_predict_uses_the_users_device_scopes_over_the_shipped_table(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path))
    shipped = load_coefficients(default_coefficients_path())
    assert default_coefficients().table == shipped.table  # no user fit yet
    folder = tmp_path / "calibration"
    folder.mkdir()
    (folder / "coefficients.json").write_text(json.dumps(_user_table({"decode_bw_efficiency": 0.5})))
    merged = default_coefficients()
    mine = merged.lookup("llama.cpp", HOST, "dram/cpu")
    assert mine.scope == f"device:{HOST}" and mine["decode_bw_efficiency"] == 0.5
    assert "mine" in mine.source
    # the user's family scope is not merged: other hosts keep the shipped CPU family
    other = merged.lookup("llama.cpp", "cpu-other-avx512-8c", "dram/cpu")
    assert other["decode_bw_efficiency"] == shipped.lookup("llama.cpp", "x", "dram/cpu")["decode_bw_efficiency"]
    assert merged.has_device("llama.cpp", HOST) and not shipped.has_device("llama.cpp", HOST)


def test_with_devices_from_keeps_both_tables_untouched():
    base = Coefficients({"engines": {"llama.cpp": {"default": {}, "families": {}, "devices": {"a": {}}}}})
    other = Coefficients(_user_table({"decode_fixed_ms": 1.0}))
    merged = base.with_devices_from(other)
    assert set(merged.table["engines"]["llama.cpp"]["devices"]) == {"a", HOST}
    assert set(base.table["engines"]["llama.cpp"]["devices"]) == {"a"}


def test_calibrate_without_out_writes_to_the_users_directory(tmp_path):
    runs = tmp_path / "runs"
    # one shipped CPU run is enough to fit a device scope
    source = next((ROOT / "runs" / "llama.cpp" / "cpu" / "qwen2.5-0.5b").glob("*.json"))
    target = runs / "llama.cpp" / "cpu" / "qwen2.5-0.5b"
    target.mkdir(parents=True)
    (target / source.name).write_text(source.read_text())
    env = {"BENCHCAL_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    before = (ROOT / "calibration" / "coefficients.json").read_bytes()
    p = subprocess.run([sys.executable, "-m", "benchcal", "calibrate", "--runs-dir", str(runs), "--bootstrap", "0"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    written = tmp_path / "home" / "calibration" / "coefficients.json"
    table = json.loads(written.read_text())
    assert "cpu-amd-epyc-avx512-2c" in table["engines"]["llama.cpp"]["devices"]
    assert "prior:" in table["source"]  # fitted over the shipped table
    assert (ROOT / "calibration" / "coefficients.json").read_bytes() == before


def test_an_uncalibrated_host_is_told_how_to_calibrate_it():
    from predictor.coefficients import HOST_UNCALIBRATED
    from predictor.devices import cpu_device
    from predictor.estimate import predict
    from predictor.models import resolve_model

    host = cpu_device(bandwidth_gbs=20.0, tflops=0.05, memory_gib=16.0, device_id="cpu-never-seen-avx2-2c")
    est = predict(resolve_model("smollm2-135m"), host, "Q4_0", 2048, coefficients="default").to_dict()
    assert HOST_UNCALIBRATED in est["calibration"]["note"]
    assert est["calibration"]["scope"] == "family:dram/cpu"
    shipped_host = cpu_device(bandwidth_gbs=30.0, tflops=0.07, memory_gib=24.0, device_id="cpu-amd-epyc-avx512-2c")
    est = predict(resolve_model("smollm2-135m"), shipped_host, "Q4_0", 2048, coefficients="default").to_dict()
    assert est["calibration"]["note"] is None and est["calibration"]["scope"] == "device:cpu-amd-epyc-avx512-2c"


def test_a_fit_with_a_prior_starts_unidentified_terms_from_it():
    from calibration.table import _parent_values

    prior = Coefficients(_user_table({"decode_fixed_ms": 7.0}))
    family = _parent_values({}, "llama.cpp", "family:dram/cpu", None, prior)
    assert family["decode_bw_efficiency"] == 0.01  # the prior's family value, not the engine default
    device = _parent_values({}, "llama.cpp", f"device:{HOST}", "dram/cpu", prior, HOST)
    assert device["decode_fixed_ms"] == 7.0
    built = {"engines": {"llama.cpp": {"default": {}, "families": {"dram/cpu": {"decode_bw_efficiency": {"value": 0.3}}},
                                       "devices": {}}}}
    assert _parent_values(built, "llama.cpp", f"device:{HOST}", "dram/cpu", prior, HOST)["decode_bw_efficiency"] == 0.3


def test_bench_without_a_model_calibrates_for_llama_cpp_only():
    p = subprocess.run([sys.executable, "-m", "benchcal", "bench", "--gpu", "cpu", "--engine", "vllm"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "calibrates this machine for llama.cpp" in p.stderr
    assert "Traceback" not in p.stderr
