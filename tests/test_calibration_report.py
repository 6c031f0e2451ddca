"""`benchcal calibrate` writes the table files and `benchcal report` renders every format, listing failed
runs and fit-verdict errors."""

from __future__ import annotations

import csv
import json

import pytest
from test_calibration_fit import (
    FIXTURE_MODELS,
    FIXTURE_NOTE,
    FIXTURE_QUANTS,
    FIXTURE_RUNS_PER_MODEL_AND_QUANT,
    TRUE_DEVICE_COEFFICIENTS,
    write_formula_fixture,
)

from benchcal.cli import main
from harness import records
from predictor.coefficients import load_coefficients


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """Formula-generated fixture runs, one labelled OOM record, and `benchcal calibrate` output."""
    root = tmp_path_factory.mktemp("report")
    runs = write_formula_fixture(root / "fixture")
    oom = records.new_record({"model": "llama-3.1-8b", "quant": "Q8_0", "device": "rtx-4090", "context": 8192,
                              "notes": FIXTURE_NOTE}, status="oom", reason="cudaMalloc failed: out of memory",
                             provenance={"synthetic_fixture": True})
    records.write_record(oom, runs)
    assert main(["calibrate", "--runs-dir", str(runs), "--out", str(root / "out"), "--bootstrap", "5"]) == 0
    return root, runs


def test_calibrate_writes_json_csv_and_markdown(calibrated):
    root, _runs = calibrated
    table = load_coefficients(root / "out" / "coefficients.json")
    cset = table.lookup("llama.cpp", "rtx-4090", "gddr6x/ada")
    assert cset.status == "calibrated" and cset.scope == "device:rtx-4090"
    assert set(cset.error_band) >= {"decode", "prefill", "memory"}
    doc = json.loads((root / "out" / "coefficients.json").read_text())
    assert set(doc["cross_validation"]) == {"in_sample", "lodo", "lomo", "lofo", "loso"}
    rows = list(csv.DictReader((root / "out" / "coefficients.csv").open()))
    assert {"decode_bw_efficiency", "runtime_fixed_gib"} <= {r["coefficient"] for r in rows}
    assert all(r["n_runs"] for r in rows)
    md = (root / "out" / "coefficients.md").read_text()
    assert "leave one device out" in md and "leave one source out" in md and "## llama.cpp — device `rtx-4090`" in md


@pytest.mark.parametrize("fmt", ["table", "md", "json", "html"])
def test_report_renders_every_format(calibrated, fmt, tmp_path):
    root, runs = calibrated
    out = tmp_path / f"report.{fmt}"
    assert main(["report", "--runs-dir", str(runs), "--coefficients", str(root / "out" / "coefficients.json"),
                 "--format", fmt, "--output", str(out)]) == 0
    text = out.read_text()
    if fmt == "json":
        data = json.loads(text)
        assert data["schema"] == "benchcal.report/1"
        assert len(data["rows"]["decode"]) == (len(TRUE_DEVICE_COEFFICIENTS) * len(FIXTURE_MODELS) * len(FIXTURE_QUANTS)
                                               * FIXTURE_RUNS_PER_MODEL_AND_QUANT)
        assert data["failed_runs"][0]["status"] == "oom"
    elif fmt == "html":
        assert text.startswith("<!doctype html>") and "<svg" in text
        assert "Decode: measured vs predicted" in text
    else:
        assert "Failed runs" in text and "cudaMalloc failed" in text
        assert "Fit-verdict errors" in text


def test_report_lists_an_oom_the_predictor_says_fits(calibrated, tmp_path):
    root, runs = calibrated
    out = tmp_path / "report.json"
    main(["report", "--runs-dir", str(runs), "--coefficients", str(root / "out" / "coefficients.json"),
          "--format", "json", "--output", str(out)])
    errors = json.loads(out.read_text())["fit_verdict_errors"]
    assert [e["status"] for e in errors] == ["oom"]
    assert errors[0]["verdict"] in ("fits", "tight")
