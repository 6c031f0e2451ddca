"""`benchcal check`: exit 0 within thresholds and baseline, exit 1 on a regression, printing the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_calibration_fit import write_formula_fixture

from benchcal.cli import main
from calibration.check import load_thresholds
from calibration.dataset import load_dataset
from calibration.output import write_table
from calibration.table import fit_table
from predictor.errors import BenchcalError


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Formula-generated fixture runs (see test_calibration_fit) and a table fitted to them."""
    root = tmp_path_factory.mktemp("check")
    runs = write_formula_fixture(root / "fixture")
    table = fit_table(load_dataset(runs))
    write_table(table, root / "good")
    worse = json.loads(json.dumps(table))
    for entry in worse["engines"]["llama.cpp"]["devices"].values():
        entry["decode_bw_efficiency"]["value"] *= 0.6  # 40% lower bandwidth efficiency: decode far off
    write_table(worse, root / "bad")
    slightly = json.loads(json.dumps(table))
    for entry in slightly["engines"]["llama.cpp"]["devices"].values():
        entry["decode_bw_efficiency"]["value"] *= 0.93
    write_table(slightly, root / "slightly")
    thresholds = root / "accuracy.toml"
    thresholds.write_text("[thresholds]\ndecode_mape = 0.10\ndecode_p90 = 0.20\nprefill_mape = 0.15\n"
                          "ttft_mape = 0.15\nmemory_rel = 0.03\nmemory_abs_mib = 256\n"
                          "[tolerance]\nmape_increase = 0.02\n")
    return root, runs, thresholds


def _check(root, runs, thresholds, table: str, *extra: str) -> int:
    return main(["check", "--runs-dir", str(runs), "--coefficients", str(root / table / "coefficients.json"),
                 "--thresholds", str(thresholds), *extra])


def test_check_passes_with_the_fitted_table(calibrated, capsys):
    root, runs, thresholds = calibrated
    assert _check(root, runs, thresholds, "good", "--baseline", "none") == 0
    out = capsys.readouterr().out
    assert "ok: every error within its threshold" in out
    assert "llama.cpp/rtx-4090: decode 0.0%" in out


def test_check_fails_when_an_error_exceeds_its_threshold(calibrated, capsys):
    root, runs, thresholds = calibrated
    assert _check(root, runs, thresholds, "bad", "--baseline", "none") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "llama.cpp/rtx-4090 decode: MAPE" in out and "> 10.0%" in out


def test_check_fails_when_worse_than_the_baseline(calibrated, capsys):
    root, runs, thresholds = calibrated
    baseline = root / "baseline.json"
    assert _check(root, runs, thresholds, "good", "--baseline", str(baseline), "--write-baseline") == 0
    assert json.loads(baseline.read_text())["groups"]["llama.cpp/rtx-4090"]["decode"]["mape"] == 0.0
    capsys.readouterr()
    assert _check(root, runs, thresholds, "slightly", "--baseline", str(baseline)) == 1
    out = capsys.readouterr().out
    assert "worse than baseline" in out
    assert _check(root, runs, thresholds, "good", "--baseline", str(baseline)) == 0


def test_per_group_overrides_apply(calibrated, tmp_path):
    root, runs, thresholds = calibrated
    loose = tmp_path / "loose.toml"
    loose.write_text(thresholds.read_text() + '[overrides."llama.cpp/rtx-4090"]\ndecode_mape = 0.9\ndecode_p90 = 0.9\n'
                     '[overrides."llama.cpp/a100-sxm-80gb"]\ndecode_mape = 0.9\ndecode_p90 = 0.9\n')
    assert load_thresholds(loose).limit("llama.cpp/rtx-4090", "decode_mape") == 0.9
    assert _check(root, runs, loose, "bad", "--baseline", "none") == 0


def test_thresholds_file_errors_are_user_errors(tmp_path):
    with pytest.raises(BenchcalError, match="not found"):
        load_thresholds(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('[overrides."llama.cpp/cpu"]\ndecode_speed = 1\n')
    with pytest.raises(BenchcalError, match="unknown metric"):
        load_thresholds(bad)


def test_committed_thresholds_file_loads():
    thresholds = load_thresholds(Path(__file__).resolve().parents[1] / "calibration" / "accuracy.toml")
    assert thresholds.limits["decode_mape"] == 0.10
    assert thresholds.limits["memory_abs_mib"] == 256
    assert (thresholds.limits["held_out_decode_mape"], thresholds.limits["held_out_prefill_mape"]) == (0.10, 0.15)


def test_the_held_out_gate_refits_without_each_public_source(tmp_path, capsys):
    # make check: the shipped runs' public results held out by source (a refit per source) against their limits
    # (10% decode, 15% prefill); a limit below what they reach fails, naming the quantity
    ROOT = Path(__file__).resolve().parents[1]
    tight = tmp_path / "tight.toml"
    tight.write_text((ROOT / "calibration" / "accuracy.toml").read_text().replace(
        "held_out_prefill_mape = 0.15", "held_out_prefill_mape = 0.05"))
    assert main(["check", "--runs-dir", str(ROOT / "runs"), "--thresholds", str(tight), "--held-out"]) == 1
    out = capsys.readouterr().out
    lines = {q: next(line for line in out.splitlines() if f"llama.cpp public results held out by source: {q}" in line)
             for q in ("decode", "prefill")}
    decode, prefill = (float(lines[q].split(f"{q} ")[1].split("%")[0]) for q in ("decode", "prefill"))
    assert decode <= 10.0 and prefill <= 15.0  # the committed table meets the shipped limits held out
    assert "public results held out by source, prefill: MAPE" in out and "> 5.0%" in out
    assert "public results held out by source, decode" not in out.split("FAILED")[1]
    # each source's fold is printed, with the worst row and the rows the score leaves out, by reason
    folds = [line for line in out.splitlines() if line.startswith("    prefill fold ")]
    assert len(folds) >= 10 and any("fold llama3-gpu-benchmarks:" in line for line in folds)
    mapes = [float(line.split(": ")[-1].split("%")[0]) for line in folds]
    assert mapes == sorted(mapes, reverse=True)  # worst first
    assert any(line.startswith("    decode worst row ") and "more than 2x off" in line for line in out.splitlines())
    left = next(line for line in out.splitlines() if line.startswith("    prefill rows left out of the score: "))
    assert "mixture-of-experts prefill: " in left and "llama-perplexity" in left
    # the by-source prefill errors of prompts after cached tokens apart from those from an empty cache
    depth = next(line for line in out.splitlines() if line.startswith("    prefill held out by source, by cache depth: "))
    assert "at depth " in depth and "empty cache " in depth
    # vLLM's batch-1 decode on GPUs, held out apart from llama.cpp's, against its own limit (15%)
    vllm = next(line for line in out.splitlines() if "vllm public results held out by source: decode" in line)
    assert float(vllm.split("decode ")[1].split("%")[0]) <= 15.0 and "limit 15%" in vllm
    assert any(line.startswith("    decode fold qwen2.5-speed: ") for line in out.splitlines())


def test_the_held_out_check_prints_backend_and_class_folds_beside_the_sources():
    # a slice of the shipped public results (read-only): an RTX 4090's (CUDA; dense models and gpt-oss-20b, a
    # mixture of experts), an M1 Max's (Metal) and the Strix Halo's (ROCm and Vulkan), from several sources each
    from pathlib import Path

    from calibration.check import load_thresholds, run_check, summary_lines
    from calibration.dataset import load_dataset
    from predictor.coefficients import Coefficients

    shipped = Path(__file__).resolve().parents[1] / "runs" / "imported" / "llama.cpp"
    dataset = load_dataset([str(shipped / d) for d in ("rtx-4090", "macbook-pro-m1-max-64gb", "ryzen-ai-max-395-128gb")])
    result = run_check(dataset, Coefficients(), load_thresholds(None), held_out=True)
    decode = result.held_out["decode"]
    assert set(decode["by"]) == {"backend", "class"}
    assert {"CUDA", "Metal", "Vulkan"} <= set(decode["by"]["backend"]["folds"])
    assert set(decode["by"]["class"]["folds"]) == {"dense", "moe"}
    text = "\n".join(summary_lines(result))
    assert "decode held out by backend: " in text and "held out by class: " in text


def test_check_groups_a_run_the_catalogue_cannot_place(tmp_path, capsys):
    """A public log of a model the catalogue lacks (ggml-ci's OpenLLaMA 7B v2) has no device id in the dataset:
    check still groups the rest (with pandas 3 such an id stays NaN, and sorting labels failed)."""
    from calibration.importers_llama_log import import_llama_log
    from calibration.public_data import DATA_DIR, load_manifest

    entry = next(e for e in load_manifest() if e["file"] == "ggml-ci/v100-open-llama-7b-v2-b2197/q4_0.log")
    written, _ = import_llama_log(DATA_DIR / entry["file"], model=entry["model"], runs_dir=tmp_path / "runs",
                                  gpu=entry.get("gpu"), source_url=entry["url"])
    placed = next(e for e in load_manifest() if e["kind"] == "llama-log" and e["model"] != entry["model"])
    more, _ = import_llama_log(DATA_DIR / placed["file"], model=placed["model"], runs_dir=tmp_path / "runs",
                               gpu=placed.get("gpu"), source_url=placed["url"])
    assert written and more
    assert main(["check", "--runs-dir", str(tmp_path / "runs")]) in (0, 1)  # a verdict, not an internal error
    assert "internal error" not in capsys.readouterr().err
