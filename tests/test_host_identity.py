"""A CPU host's calibration identity, its probes, and how llama.cpp's CPU kernels split a model's matrices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import hostbench
from harness.hostinfo import (
    flags_from_system_info,
    host_device_id,
    isa_level,
    model_slug,
    parse_cpuinfo_flags,
    record_host_id,
)

DATA = Path(__file__).parent / "data" / "host"
RUNS = Path(__file__).resolve().parents[1] / "runs"


def test_cpuinfo_flags_give_the_isa_level_and_the_host_id():
    flags = parse_cpuinfo_flags((DATA / "cpuinfo-amd-epyc-avx2.txt").read_text())
    assert {"avx2", "fma", "f16c"} <= set(flags) and "avx512f" not in flags
    assert isa_level(flags) == "avx2"
    assert host_device_id("AMD EPYC", flags, 2) == "cpu-amd-epyc-avx2-2c"


def test_isa_levels_name_the_widest_extension():
    assert isa_level(["avx2", "avx512f", "amx_tile"]) == "amx"
    assert isa_level(["avx", "avx2", "avx512f"]) == "avx512"
    assert isa_level(["asimd", "sve"]) == "sve"
    assert isa_level(["asimd"]) == "neon"
    assert isa_level([]) == "scalar"


def test_model_names_lose_their_vendor_noise():
    assert model_slug("Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.0GHz") == "intel-xeon-platinum-8480"
    assert model_slug("AMD Ryzen 9 7950X 16-Core Processor") == "amd-ryzen-9-7950x"
    assert model_slug("") == "unknown"


def test_the_shipped_cpu_runs_name_the_avx512_host_their_logs_describe():
    # llama.cpp's system info in each committed CPU run's log says AVX512 = 1: the host is not this one
    paths = sorted((RUNS / "llama.cpp" / "cpu").rglob("*.json"))
    assert paths
    for path in paths:
        record = json.loads(path.read_text())
        flags = flags_from_system_info("\n".join(record["log_tail"]))
        assert flags is not None and isa_level(flags) == "avx512"
        assert record_host_id(record["provenance"]) == "cpu-amd-epyc-avx512-2c"
    assert flags_from_system_info("no system info here") is None


def test_a_record_without_a_stored_host_id_is_identified_from_its_model_flags_and_cores():
    assert record_host_id({"cpu_model": "AMD EPYC", "cpu_flags": ["avx", "avx2"], "cpu_cores": 4}) == "cpu-amd-epyc-avx2-4c"
    assert record_host_id({"cpu_model": "AMD EPYC"}) is None


def test_a_disturbed_probe_is_repeated_and_flagged(monkeypatch):
    rounds = iter([[10.0, 14.0, 7.0, 12.0, 9.0], [10.0, 10.1, 9.9, 10.0, 10.05]])
    samples, disturbed = hostbench._steady(lambda: next(rounds))
    assert not disturbed and samples[0] == 10.0  # the second, steady round
    noisy = [[10.0, 14.0, 7.0, 12.0, 9.0]] * hostbench.ATTEMPTS
    it = iter(noisy)
    samples, disturbed = hostbench._steady(lambda: next(it))
    assert disturbed
    assert hostbench.robust_spread([10.0, 10.0, 10.0]) == 0.0


def test_a_disturbed_bandwidth_probe_is_used_and_cached_for_an_hour_only(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCHCAL_CACHE", str(tmp_path))
    monkeypatch.setattr(hostbench, "_PROBED", {})
    monkeypatch.setattr(hostbench, "copy_bandwidth_samples", lambda: [20.0, 30.0, 12.0, 25.0, 16.0])
    monkeypatch.setattr(hostbench, "engine_matmul_gflops", lambda refresh=False: {"matmul_gflops": 50.0})
    profile = hostbench.host_profile()  # no engine bandwidth: the copy loop's figure
    assert profile["bandwidth_gbs"] == 30.0 and profile["probe_disturbed"] == ["copy"]
    (cached,) = tmp_path.rglob("bandwidth-*.json")
    monkeypatch.setattr(hostbench, "_PROBED", {})  # another process, within the hour: no new probe
    monkeypatch.setattr(hostbench, "copy_bandwidth_samples", lambda: [20.0, 20.1, 19.9, 20.0, 20.05])
    assert hostbench.host_profile()["probe_disturbed"] == ["copy"]
    data = json.loads(cached.read_text())
    data["measured_at_unix"] -= hostbench.DISTURBED_TTL_S + 1  # an hour later: probed again, steady this time
    cached.write_text(json.dumps(data))
    monkeypatch.setattr(hostbench, "_PROBED", {})
    assert hostbench.host_profile()["probe_disturbed"] == []
    data = json.loads(cached.read_text())
    data["measured_at_unix"] -= hostbench.DISTURBED_TTL_S + 1  # a steady figure lasts the week
    cached.write_text(json.dumps(data))
    monkeypatch.setattr(hostbench, "_PROBED", {})
    monkeypatch.setattr(hostbench, "copy_bandwidth_samples", lambda: pytest.fail("a steady figure is not probed again"))
    assert hostbench.host_profile()["bandwidth_gbs"] == 20.1


def test_the_probe_figures_of_a_stored_run_are_the_probe_arithmetic():
    # the shipped AVX-512 host's probe figures come from its own run of the probe configuration
    record = next(json.loads(p.read_text()) for p in (RUNS / "llama.cpp" / "cpu").rglob("*.json"))
    prov = record["provenance"]
    tok_s = float(re.search(r"at ([0-9.]+) tok/s", prov["host_matmul_source"]).group(1))
    assert prov["host_matmul_gflops"] == pytest.approx(hostbench.probe_gflops_from_tok_s(tok_s), rel=1e-3)
    tok_s = float(re.search(r"at ([0-9.]+) tok/s", prov["host_bandwidth_source"]).group(1))
    assert prov["host_bandwidth_gbs"] == pytest.approx(hostbench.probe_bandwidth_from_tok_s(tok_s), rel=1e-3)
    assert prov["host_copy_bandwidth_gbs"] == 30.29  # the copy loop's figure the run measured


@pytest.mark.parametrize("model,quant", [("qwen2.5-0.5b", "Q4_K_M"), ("qwen2.5-0.5b", "Q4_0"),
                                         ("smollm2-135m", "Q4_K_M"), ("smollm2-135m", "Q4_0")])
def test_the_cpu_repack_buffer_is_the_plans_q4_0_and_q4_k_matrices(model, quant):
    from harness.synthetic import resolve_arch, resolve_spec, weights_bytes
    from predictor.gguf_layout import tensor_plan
    from predictor.weights import cpu_kernel_mix

    log = (DATA / f"llama-cpu-load-{model}-{quant.lower()}.log").read_text()
    repack_mib = float(re.search(r"CPU_REPACK model buffer size = +([0-9.]+) MiB", log).group(1))
    spec = resolve_spec(model)
    plan = [t for t in tensor_plan(spec, quant) if t.name.startswith("blk.") and len(t.shape) >= 2]
    layer_bytes = sum(t.nbytes for t in plan)
    mix = cpu_kernel_mix(resolve_arch(model), quant)
    assert mix.repacked_bytes * layer_bytes / 2**20 == pytest.approx(repack_mib, abs=0.01)
    assert weights_bytes(spec, quant) > layer_bytes


def test_float_and_q8_formats_take_their_own_cpu_paths():
    from harness.synthetic import resolve_arch
    from predictor.weights import cpu_kernel_mix

    arch = resolve_arch("qwen2.5-0.5b")
    assert cpu_kernel_mix(arch, "F16").float_weights == 1.0
    assert cpu_kernel_mix(arch, "Q8_0").q8_weights == 1.0 and cpu_kernel_mix(arch, "Q8_0").generic_weights == 0.0
    k = cpu_kernel_mix(arch, "Q4_K_M")  # rows of 896 are no multiple of 256: most tensors fall back to Q5_0
    assert 0 < k.repacked_weights < 0.2 and k.generic_weights > 0.7


TINY_HOST_SWEEP = """
name = "tiny-host"
[defaults]
engine = "llama.cpp"
device = "cpu"
context = 256
prompt_tokens = [16, 64]
gen_tokens = 8
reps = 2
warmup = 0
arch_overrides = { num_layers = 2, vocab_size = 2048 }

[[configs]]
model = "smollm2-135m"
quant = ["F16", "Q8_0", "Q4_0"]
"""


def _without_host(monkeypatch, tmp_path: Path, shipped: bytes, host_id: str) -> None:
    """Make the table ``predict`` starts from the shipped one less ``host_id``'s device scopes."""
    from predictor import coefficients

    table = json.loads(shipped)
    for eng in table.get("engines", {}).values():
        (eng.get("devices") or {}).pop(host_id, None)
    path = tmp_path / "shipped-without-host.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(coefficients, "default_coefficients_path", lambda: path)


@pytest.mark.engine
def test_bench_without_a_model_calibrates_an_unmeasured_host_then_checks_it(monkeypatch, tmp_path, capsys):
    # The default path of `benchcal bench` on a CPU no table describes: measure the host sweep into the user's
    # runs, fit them over the shipped table into the user's calibration, print before / after; the second call
    # finds the host calibrated and measures the smoke sweep instead.
    pytest.importorskip("llama_cpp")
    from benchcal import cli
    from benchcal.commands import host_calibration
    from harness.hostinfo import host_identity

    sweep_file = tmp_path / "tiny-host.toml"
    sweep_file.write_text(TINY_HOST_SWEEP)
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(host_calibration.HOST_SWEEP, "cpu", str(sweep_file))
    monkeypatch.setitem(host_calibration.SMOKE_SWEEP, "cpu", str(sweep_file))
    monkeypatch.setitem(host_calibration.UNMEASURED, "cpu", [
        {"model": "smollm2-360m", "quant": "Q4_0", "context": 256, "prompt_tokens": [16, 64]}])
    host_id = host_identity()["host_id"]
    shipped = (Path(__file__).resolve().parents[1] / "calibration" / "coefficients.json").read_bytes()
    # this machine may be the host the shipped runs describe: the table it starts from leaves that host out
    _without_host(monkeypatch, tmp_path, shipped, host_id)
    assert cli.main(["bench", "--gpu", "cpu"]) == 0
    out = capsys.readouterr()
    assert "uncalibrated on this host" in out.err
    assert "host calibration: measured / prior" in out.out and "MAPE calibrated" in out.out
    assert "smollm2-360m Q4_0 ctx 256: decode" in out.out
    table = json.loads((tmp_path / "home" / "calibration" / "coefficients.json").read_text())
    assert host_id in table["engines"]["llama.cpp"]["devices"]
    stored = sorted((tmp_path / "home" / "runs").rglob("*.json"))
    assert len(stored) == 3
    assert all(json.loads(p.read_text())["provenance"]["host_id"] == host_id for p in stored)
    assert (Path(__file__).resolve().parents[1] / "calibration" / "coefficients.json").read_bytes() == shipped
    assert cli.main(["bench", "--gpu", "cpu"]) == 0
    out = capsys.readouterr()
    assert f"{host_id} is calibrated" in out.err and "measured vs predicted" in out.out
    assert len(sorted((tmp_path / "home" / "runs").rglob("*.json"))) == 6
