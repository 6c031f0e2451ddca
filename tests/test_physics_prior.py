"""The physics prior for devices of an unmeasured family, and the band of predictions with no fitted scope."""

from __future__ import annotations

import math

import pytest

from calibration.overlays import fit_unit_limit
from predictor.coefficients import default_coefficients_path, load_coefficients
from predictor.devices import resolve_device
from predictor.estimate import predict
from predictor.prior import flops_per_byte, memory_class, prior_values, unit_limited_efficiency

ENTRY = {"decode_bw_efficiency": {"all": {"value": 0.9}, "by_memory_class": {"hbm": {"value": 0.5},
                                                                             "gddr": {"value": 0.93}}},
         "prefill_compute_efficiency": {"log_intercept": math.log(0.3), "log_slope": -0.25,
                                        "ratio_range": [0.1, 0.4]}}


def test_memory_classes_and_the_ratio_the_prefill_prior_follows():
    assert [memory_class(m) for m in ("HBM3e", "GDDR6X", "LPDDR5X", "dram", None)] == [
        "hbm", "gddr", "lpddr", "other", "other"]
    assert flops_per_byte(989.5, 4800.0) == pytest.approx(0.2061, rel=1e-3)
    assert flops_per_byte(None, 100.0) is None and flops_per_byte(10.0, 0.0) is None


def test_the_prior_takes_the_memory_class_and_never_extrapolates_the_ratio():
    hbm = prior_values(ENTRY, "HBM3", 400.0, 2000.0)  # ratio 0.2: inside the fitted range
    assert hbm["decode_bw_efficiency"] == 0.5
    assert hbm["prefill_compute_efficiency"] == pytest.approx(0.3 * 0.2 ** -0.25)
    other = prior_values(ENTRY, "LPDDR5X", 2000.0, 273.0)  # ratio 7.3: clipped to 0.4
    assert other["decode_bw_efficiency"] == 0.9  # no measured class: all devices
    assert other["prefill_compute_efficiency"] == pytest.approx(0.3 * 0.4 ** -0.25)
    assert "prefill_compute_efficiency" not in prior_values(ENTRY, "HBM3", None, 2000.0)


def test_the_unit_limit_caps_the_efficiency_of_a_device_whose_sms_cannot_carry_its_bandwidth():
    entry = {"decode_bw_efficiency": {**ENTRY["decode_bw_efficiency"],
                                      "unit_limit": {"cap": 0.9, "bytes_per_cycle": 7.0}}}
    assert prior_values(entry, "HBM2e", None, 2039.0, 13.4)["decode_bw_efficiency"] == pytest.approx(7.0 / 13.4)
    assert prior_values(entry, "GDDR6X", None, 1008.0, 3.1)["decode_bw_efficiency"] == 0.9  # below the limit: cap
    # no unit and clock figures: the memory class's median, as before
    assert prior_values(entry, "HBM3", None, 4000.0, None)["decode_bw_efficiency"] == 0.5
    assert unit_limited_efficiency(0.9, 7.0, 20.0) == pytest.approx(0.35)


def test_prefill_takes_the_flops_each_unit_issues_per_cycle_where_the_device_has_unit_and_clock_figures():
    entry = {"prefill_compute_efficiency": {**ENTRY["prefill_compute_efficiency"],
                                            "unit_limit": {"cap": 0.48, "flops_per_cycle": 1000.0}}}
    # an H100 PCIe: 756 TFLOPS over 114 SMs at 1.755 GHz, 3,779 FLOP per SM per cycle
    h100 = prior_values(entry, "HBM2e", 756.0, 2000.0, None, 114 * 1.755e9)
    assert h100["prefill_compute_efficiency"] == pytest.approx(1000.0 / 3779.0, rel=1e-3)
    rtx = prior_values(entry, "GDDR6X", 330.4, 1008.0, None, 128 * 2.52e9)  # 1,024: at the cap
    assert rtx["prefill_compute_efficiency"] == 0.48
    # without unit and clock figures: the FLOPS-per-byte rule
    assert prior_values(entry, "HBM3", 400.0, 2000.0)["prefill_compute_efficiency"] == pytest.approx(0.3 * 0.2 ** -0.25)


def test_the_unit_limit_fit_recovers_cap_and_limit_and_otherwise_takes_the_largest_limit_not_contradicted():
    b = [2.3, 3.1, 3.8, 5.1, 6.7, 10.0, 13.4]
    eff = [unit_limited_efficiency(0.92, 6.8, x) for x in b]
    cap, per_cycle = fit_unit_limit(b, eff)
    assert cap == pytest.approx(0.92, abs=0.006) and per_cycle == pytest.approx(6.8, abs=0.02)
    # no device limited: the smallest limit that leaves every one of them at the cap (here 0.92 x 6.7)
    cap, per_cycle = fit_unit_limit(b[:5], [0.92] * 5)
    assert cap == pytest.approx(0.92, abs=0.006) and per_cycle == pytest.approx(0.92 * 6.7, abs=0.05)


@pytest.fixture(scope="module")
def shipped():
    return load_coefficients(default_coefficients_path())


def test_the_shipped_prior_limits_the_bytes_each_sm_carries_and_states_its_band(shipped):
    entry = shipped.table["engines"]["llama.cpp"]["physics"]["kinds"]["gpu"]
    classes = entry["decode_bw_efficiency"]["by_memory_class"]
    assert classes["hbm"]["value"] < classes["gddr"]["value"]
    assert set(classes["hbm"]["devices"]) <= {"a100-pcie-80gb", "a100-sxm-80gb", "h100-pcie", "v100-pcie-16gb"}
    limit = entry["decode_bw_efficiency"]["unit_limit"]
    assert 0.8 <= limit["cap"] <= 1.0 and 5.0 <= limit["bytes_per_cycle"] <= 9.0  # A100s and the H100 bind: ~6.7
    assert {"a100-sxm-80gb", "h100-pcie", "rtx-4090"} <= set(limit["devices"])
    assert entry["prefill_compute_efficiency"]["log_slope"] <= 0
    flops = entry["prefill_compute_efficiency"]["unit_limit"]  # the A100s and the H100 bind at ~1,000 FLOP/SM/cycle
    assert 0.3 <= flops["cap"] <= 0.7 and 700 <= flops["flops_per_cycle"] <= 1300
    assert {"a100-sxm-80gb", "h100-pcie"} <= set(flops["devices"])
    assert entry["error_band"]["decode"] > 0 and "LOFO" in entry["error_band_source"]


def test_a_device_of_an_unmeasured_family_takes_the_prior_and_a_measured_one_does_not(shipped):
    h200 = resolve_device("h200-sxm")  # hbm3e/hopper: no run, no measured family
    cset = shipped.lookup("llama.cpp", h200.id, h200.family, None, h200.kind, h200)
    limit = shipped.table["engines"]["llama.cpp"]["physics"]["kinds"]["gpu"]["decode_bw_efficiency"]["unit_limit"]
    assert cset.scope == "prior:physics/gpu"
    # 4,800 GB/s over 132 SMs at 1.98 GHz: 18.4 bytes per SM per cycle, beyond what the measured SMs carried
    assert cset["decode_bw_efficiency"] == pytest.approx(limit["bytes_per_cycle"] / h200.bytes_per_unit_cycle)
    assert cset["decode_bw_efficiency"] < limit["cap"]
    assert cset.origin["decode_bw_efficiency"] == "prior:physics/gpu" and "LOFO" in cset.band_source
    assert "physics prior" in cset.source_of("decode_bw_efficiency")
    rtx = resolve_device("rtx-4090")
    measured = shipped.lookup("llama.cpp", rtx.id, rtx.family, None, rtx.kind, rtx)
    assert measured.scope == "device:rtx-4090" and measured.origin["decode_bw_efficiency"] == "device:rtx-4090"


def test_vllm_on_a_gpu_nobody_measured_takes_the_engine_scope_and_says_how_far_it_reaches(shipped):
    # vLLM's GPU runs are an A100's (Qwen's speed tables): an H100 takes the engine scope, extrapolated, with the
    # widest band (the defaults' error on the kind, leave-one-device-out, the scope's own)
    est = predict("qwen2.5-7b", "h100-sxm", "BF16", 8192, "vllm", coefficients=shipped, launch=False)
    cal = est.to_dict()["calibration"]
    assert cal["status"] == "calibrated" and cal["scope"] == "engine"
    assert cal["evidence"]["level"] == "extrapolated"
    assert set(cal["error_band"]) >= {"decode", "prefill"} and all(v > 0 for v in cal["error_band"].values())
    assert "the widest of" in cal["error_band_source"]
    assert cal["era"]["applied"] is False and cal["era"]["note"]


def test_an_eras_prefill_efficiency_stops_at_its_kernels_per_unit_knee(shipped):
    from predictor.prior import flops_per_unit_cycle, knee_factor

    assert knee_factor(1000.0, 3786.0) == pytest.approx(1000.0 / 3786.0) and knee_factor(1000.0, 800.0) == 1.0
    assert knee_factor(None, 3786.0) == 1.0 and knee_factor(1000.0, None) == 1.0
    h200 = resolve_device("h200-sxm")
    assert flops_per_unit_cycle(h200, "llama.cpp") == pytest.approx(989.5e12 / (132 * 1.98e9), rel=0.02)
    overlay = shipped.table["engines"]["llama.cpp"]["eras"]["2025"]["kinds"]["gpu"]["prefill_compute_efficiency"]
    knee = overlay["unit_knee"]
    assert 600 <= knee <= 1500  # the MMQ kernels of current builds: about what a GeForce SM issues (1,024)
    # a GH200 run of build 5124 reached 0.14 of its FP16 peak in pp512; the era's value at its f gives about that
    gh200 = resolve_device("gh200")
    cset = shipped.lookup("llama.cpp", gh200.id, gh200.family, "2025", gh200.kind, gh200)
    f = flops_per_unit_cycle(gh200, "llama.cpp")
    if cset.origin["prefill_compute_efficiency"] == "era:2025/gpu":
        assert cset["prefill_compute_efficiency"] == pytest.approx(overlay["value"] * knee / f, rel=1e-6)
    rtx = resolve_device("rtx-5090")
    own = shipped.lookup("llama.cpp", rtx.id, rtx.family, "2025", rtx.kind, rtx)
    assert own["prefill_compute_efficiency"] > 2 * cset["prefill_compute_efficiency"]


def test_a_term_no_device_or_family_scope_identified_takes_the_prior():
    from predictor.coefficients import Coefficients

    physics = {"kinds": {"gpu": {"decode_bw_efficiency": {"unit_limit": {"cap": 0.9, "bytes_per_cycle": 7.0}}}}}
    held = {"value": 0.95, "identified": False}
    table = {"schema_version": 1, "engines": {"llama.cpp": {
        "default": {"decode_bw_efficiency": {"value": 0.95, "identified": True}},
        "families": {"hbm2e/ampere": {"decode_bw_efficiency": held,  # measured in prefill only: held
                                      "prefill_compute_efficiency": {"value": 0.3, "identified": True}}},
        "devices": {}, "physics": physics}}}
    a100 = resolve_device("a100-sxm-80gb")
    cset = Coefficients(table).lookup("llama.cpp", a100.id, a100.family, None, a100.kind, a100)
    assert cset["decode_bw_efficiency"] == pytest.approx(7.0 / a100.bytes_per_unit_cycle)
    assert cset.origin["decode_bw_efficiency"] == "prior:physics/gpu"
    assert cset["prefill_compute_efficiency"] == 0.3 and cset.scope == "family:hbm2e/ampere"
    table["engines"]["llama.cpp"]["families"]["hbm2e/ampere"]["decode_bw_efficiency"] = {"value": 0.6,
                                                                                          "identified": True}
    assert Coefficients(table).lookup("llama.cpp", a100.id, a100.family, None, a100.kind, a100)[
        "decode_bw_efficiency"] == 0.6


def test_a_current_gpu_nobody_measured_takes_the_fixed_times_of_the_gpus_that_run_cuda_graphs(shipped):
    entry = {"fixed_times": {"decode_fixed_per_layer_us": {"value": 95.0}}}
    assert prior_values(entry, "HBM3", None, None, eras_apply=True) == {"decode_fixed_per_layer_us": 95.0}
    assert prior_values(entry, "HBM2", None, None, eras_apply=False) == {}  # a Volta or Turing GPU: not these
    physics = shipped.table["engines"]["llama.cpp"]["physics"]["kinds"]["gpu"]["fixed_times"]
    assert "v100-pcie-16gb" not in physics["decode_fixed_per_layer_us"]["devices"]
    engine = shipped.table["engines"]["llama.cpp"]["default"]["decode_fixed_per_layer_us"]["value"]
    assert physics["decode_fixed_per_layer_us"]["value"] < engine  # the V100's graph-less launches left out
    h200 = resolve_device("h200-sxm")
    cset = shipped.lookup("llama.cpp", h200.id, h200.family, None, h200.kind, h200)
    assert cset["decode_fixed_per_layer_us"] == physics["decode_fixed_per_layer_us"]["value"]
    t4 = resolve_device("t4")  # Turing: no CUDA graphs, so not the graph GPUs' fixed time
    assert shipped.lookup("llama.cpp", t4.id, t4.family, None, t4.kind, t4)["decode_fixed_per_layer_us"] != \
        physics["decode_fixed_per_layer_us"]["value"]
