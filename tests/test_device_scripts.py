"""The GPU evidence run's plumbing, proved on the CPU: the dry mode of scripts/device_calibrate.sh, the
helpers of scripts/device_env.sh, the H200 sweep, and the transformers fallback engine."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness import synthetic
from harness.engines.base import ENGINE_CLASSES
from harness.engines.transformers.engine import cache_bytes, torch_dtype_name
from harness.engines.transformers.logparse import parse_memory_lines
from harness.protocol import prepare_config
from harness.sweep import load_sweep
from predictor.errors import BenchcalError

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
GIB = 2**30
DEVICE_DISK_BYTES = 64 * GIB
HAS_LLAMA = (importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("gguf") is not None
             and shutil.which("zstd") is not None)
HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
RETURNED_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _bash(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _source(snippet: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source scripts/device_env.sh && {snippet}"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------ build script


def test_build_script_documents_its_options():
    result = _bash("scripts/build_llama_cuda.sh", "--help")
    assert result.returncode == 0
    for option in ("--configure-only", "--target", "--pack-source", "GGML_CUDA_NO_VMM", "LLAMA_SRC_TARBALL"):
        assert option in result.stdout


def test_build_script_refuses_an_unknown_option():
    result = _bash("scripts/build_llama_cuda.sh", "--no-such-option")
    assert result.returncode == 2
    assert "unknown option" in result.stderr


def test_shell_scripts_parse():
    for script in ("build_llama_cuda.sh", "device_calibrate.sh", "device_env.sh"):
        assert subprocess.run(["bash", "-n", str(SCRIPTS / script)]).returncode == 0, script


# ---------------------------------------------------------------------------------------------- env helpers


@pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python, gguf and zstd")
def test_site_folder_holds_the_python_packages_without_shared_libraries(tmp_path):
    result = _source(f"benchcal_prepare_site {tmp_path / 'site'} {sys.executable}")
    assert result.returncode == 0, result.stderr
    site = tmp_path / "site"
    for package in ("llama_cpp", "gguf", "diskcache"):
        assert (site / package / "__init__.py").is_file()
    assert not [p for p in site.rglob("*.so*")], "shared libraries must not travel in the site folder"
    assert "llama-cpp-python==" in (site / "SITE_INFO.txt").read_text()


@pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python and zstd")
def test_library_tarball_round_trip_keeps_libllama(tmp_path):
    lib_dir = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    tarball = tmp_path / "libs.tar.zst"
    packed = _source(f"benchcal_pack_libs {lib_dir} llama-test {tarball}")
    assert packed.returncode == 0, packed.stderr
    unpacked = _source(f"benchcal_unpack_libs {tarball} {tmp_path / 'unpacked'}")
    assert unpacked.returncode == 0, unpacked.stderr
    lib = Path(unpacked.stdout.strip())
    assert lib == tmp_path / "unpacked" / "llama-test" / "lib"
    assert (lib / "libllama.so").exists()


# ------------------------------------------------------------------------------------------- H200 sweep


def test_h200_sweep_configs_are_valid_and_headline_comes_early():
    sweep = load_sweep("h200-calibration")
    configs = [prepare_config({**c, "device": "h200-sxm"}) for c in sweep.configs]
    models = list(dict.fromkeys(c["model"] for c in configs))
    assert models == ["qwen2.5-0.5b", "qwen2.5-72b", "qwen2.5-7b", "qwen2.5-32b"]
    headline = [c for c in configs if c["model"] == "qwen2.5-72b" and c["quant"] == "Q4_K_M"
                and c["context"] == 32768 and 4096 in c["prompt_tokens"]]
    assert headline, "the 72B Q4_K_M, 4K prompt, 32K context comparison must be measured"
    assert {c["context"] for c in configs} == {4096, 32768}


def test_each_model_of_the_h200_sweep_fits_the_device_disk_on_its_own():
    sweep = load_sweep("h200-calibration")
    files: dict[str, dict[str, int]] = {}
    for config in sweep.configs:
        quant = synthetic.normalize_file_type(config["quant"])
        files.setdefault(config["model"], {})[quant] = synthetic.weights_bytes(
            synthetic.resolve_spec(config["model"]), quant)
    for model, sizes in files.items():
        assert sum(sizes.values()) < DEVICE_DISK_BYTES - 8 * GIB, (model, sizes)


# ------------------------------------------------------------------------------------- transformers engine


def test_transformers_engine_refuses_quantized_weights():
    assert torch_dtype_name(None, on_gpu=True) == "bfloat16"
    assert torch_dtype_name(None, on_gpu=False) == "float32"
    assert torch_dtype_name("f16", on_gpu=True) == "float16"
    with pytest.raises(BenchcalError, match="unquantized"):
        torch_dtype_name("Q4_K_M", on_gpu=True)


def test_transformers_memory_lines_parse_last_value_wins():
    log = ("noise\nbenchcal transformers: weights_bytes=100 allocated_bytes=5\n"
           "benchcal transformers: kv_cache_bytes=64 kv_tokens=8 allocated_bytes=7\n")
    assert parse_memory_lines(log) == {"weights_bytes": 100, "allocated_bytes": 7, "kv_cache_bytes": 64,
                                       "kv_tokens": 8}


def test_cache_bytes_is_none_for_an_unknown_cache():
    assert cache_bytes(object()) is None


@pytest.mark.engine
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers")
def test_transformers_engine_measures_a_tiny_random_model():
    from harness.engines.transformers.engine import TransformersEngine

    engine = TransformersEngine()
    config = {"model": "qwen2.5-0.5b", "quant": "F32", "device": "cpu", "context": 128,
              "arch_overrides": {"num_layers": 2, "vocab_size": 2048}, "engine_options": {}}
    try:
        info = engine.load(config, None)
        assert info.vocab_size == 2048 and info.total_layers == 2
        rng = random.Random(0)
        prompt = engine.measure_prompt(engine.random_prompt(24, rng))
        assert prompt.prompt_tokens == 24 and 0 < prompt.prefill_s <= prompt.ttft_s
        decode = engine.measure_decode(engine.random_prompt(8, rng), 5)
        assert len(decode.token_times_s) == 5
        # Qwen2.5-0.5B: 2 KV heads of 64 values, K and V, float32, over 8 + 4 cached tokens, 2 layers.
        assert decode.extra["kv_cache_bytes"] == 2 * 2 * 2 * 64 * 4 * 12
        with pytest.raises(BenchcalError, match="do not fit"):
            engine.measure_decode(engine.random_prompt(120, rng), 16)
    finally:
        engine.close()


@pytest.mark.engine
@pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers")
@pytest.mark.skipif("transformers" not in ENGINE_CLASSES,
                    reason="the transformers engine is not registered in harness.engines.base.ENGINE_CLASSES")
def test_bench_measures_the_transformers_engine_in_a_child_process(tmp_path, probed_cache):
    result = subprocess.run(
        [sys.executable, "-m", "benchcal", "bench", "--engine", "transformers", "--gpu", "cpu",
         "--model", "qwen2.5-0.5b", "--quant", "F32", "--kv-dtype", "f32", "--ctx", "256", "--prompt", "16,32",
         "--gen", "4", "--reps", "2", "--warmup", "1", "--override", "num_layers=2", "--override",
         "vocab_size=2048", "--runs-dir", str(tmp_path / "runs")],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "BENCHCAL_CACHE": str(probed_cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (tmp_path / "runs").rglob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["provenance"]["engine_version"].startswith("transformers ")
    breakdown = record["memory"]["engine_breakdown"]
    assert breakdown["weights_bytes"] > 0 and breakdown["kv_bytes"] > 0
    assert [p["prompt_tokens"] for p in record["measurements"]["prefill"]] == [16, 32]


# --------------------------------------------------------------------------------------------- dry run


def _dry_run(out: Path, work: Path, **env: str) -> subprocess.CompletedProcess:
    return _bash("scripts/device_calibrate.sh", timeout=240, env={
        "DEVICE_DRY_RUN": "1", "OUT": str(out), "DEVICE_WORK": str(work), "DEVICE_PYTHON": sys.executable,
        "DEVICE_BUDGET_S": "200", **env})


def _seed_host_probe(cache: Path, work: Path) -> None:
    """Host-probe figures copied into a dry run's cache: the probe (a minute on 2 busy cores) describes this host,
    not the run, so a dry run need not measure it again."""
    shutil.copytree(cache / "hostbench", work / "cache" / "hostbench")


def _records(runs_tarball: Path) -> list[dict]:
    with tarfile.open(runs_tarball) as archive:
        return [json.load(archive.extractfile(m)) for m in archive.getmembers() if m.name.endswith(".json")]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory, probed_cache):
    """One dry run of scripts/device_calibrate.sh (about 20 s on 2 cores), from the session's host probe."""
    if not HAS_LLAMA:
        pytest.skip("needs llama-cpp-python, gguf and zstd")
    root = tmp_path_factory.mktemp("dry")
    _seed_host_probe(probed_cache, root / "work")
    result = _dry_run(root / "out", root / "work")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "out", root / "work"


@pytest.mark.engine
def test_dry_run_measures_tiny_models_and_returns_records(dry_run):
    out, work = dry_run
    returned = sorted(p.name for p in out.iterdir())
    assert len(returned) <= 8 and all(RETURNED_NAME.match(n) and (out / n).is_file() for n in returned)
    assert {"device_calibrate.log", "gpu.json", "runs.tar.gz", "logs.tar.gz", "summary.json"} <= set(returned)

    records = _records(out / "runs.tar.gz")
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    assert {r["config"]["model"] for r in records} == {"qwen2.5-0.5b", "smollm2-135m"}
    assert all(r["measurements"]["decode"]["decode_tok_s"]["median"] > 0 for r in records)

    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s["status"] for s in summary["steps"]}
    assert steps["llama"] == "ok" and steps["sweep:qwen2.5-0.5b"] == "ok" and steps["sweep:smollm2-135m"] == "ok"
    assert summary["llama"].startswith("tarball") and len(summary["checkpoints"]) == 3

    log = (out / "device_calibrate.log").read_text()
    assert f"from {work}/site/llama_cpp" in log, "llama_cpp must come from the prepared site folder"
    assert f"library folder: {work}/llama/llama-cpu/lib" in log
    assert not list((work / "cache" / "synthetic").glob("*.gguf")), "checkpoints are deleted after their runs"


@pytest.mark.engine
def test_dry_run_plans_the_h200_sweep_one_model_at_a_time(dry_run):
    _, work = dry_run
    rows = [row.split("\t") for row in (work / "plan" / "h200" / "plan.tsv").read_text().splitlines()]
    assert [row[1] for row in rows] == ["qwen2.5-0.5b", "qwen2.5-72b", "qwen2.5-7b", "qwen2.5-32b"]
    checkpoint_bytes = {row[1]: int(row[3]) for row in rows}
    assert 40 * GIB < checkpoint_bytes["qwen2.5-72b"] < 48 * GIB
    assert all(float(row[4]) > 0 and int(row[6]) > 0 for row in rows)


@pytest.mark.engine
def test_dry_run_resumes_without_measuring_again(dry_run, tmp_path):
    out, work = dry_run
    _seed_host_probe(work / "cache", tmp_path / "work")
    result = _dry_run(tmp_path / "out", tmp_path / "work", DEVICE_RESUME_RUNS=str(out / "runs.tar.gz"))
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "out" / "device_calibrate.log").read_text()
    assert log.count("every config already measured") == 2
    assert len(_records(tmp_path / "out" / "runs.tar.gz")) == 3
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["checkpoints"] == []


@pytest.mark.engine
@pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python, gguf and zstd")
def test_dry_run_without_llama_libraries_turns_to_the_fallback(dry_run, tmp_path):
    _seed_host_probe(dry_run[1] / "cache", tmp_path / "work")
    result = _dry_run(tmp_path / "out", tmp_path / "work", LLAMA_CUDA_TARBALL=str(tmp_path / "missing.tar.zst"),
                      DEVICE_FALLBACK_MODELS="qwen2.5-0.5b")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert steps["llama"]["status"] == "failed" and "sweep" not in steps
    assert "fallback" in steps, "without llama.cpp the transformers fallback must be tried"
    if "transformers" in ENGINE_CLASSES and HAS_TORCH:
        assert result.returncode == 0, result.stderr[-3000:]
        assert {r["engine"] for r in summary["records"].values()} == {"transformers"}
    else:  # nothing measured: the script says so with its exit status
        assert result.returncode == 1 and summary["records"] == {}
