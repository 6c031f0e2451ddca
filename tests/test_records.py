"""Run records: summaries, hashing, validation, the atomic store and the pandas loaders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import record_tables, records

REPO = Path(__file__).resolve().parents[1]


def config(**changes):
    base = {"model": "smollm2-135m", "quant": "Q4_0", "context": 1024, "prompt_tokens": [256, 64],
            "gen_tokens": 32, "engine_options": {"n_gpu_layers": 0, "threads": 2}}
    base.update(changes)
    return base


def measured_record(**changes):
    """A record shaped like the harness writes it (values are arbitrary inputs for the loaders)."""
    prefill = [{"prompt_tokens": n, "ttft_ms": records.summarize([n / 10, n / 9]),
                "prefill_tok_s": records.summarize([1000.0 + n, 1010.0 + n])} for n in (64, 256)]
    return records.new_record(
        config(**changes),
        measurements={"load_s": 0.5, "prefill": prefill,
                      "decode": {"gen_tokens": 32, "decode_tok_s": records.summarize([50.0, 52.0, 54.0]),
                                 "context_at_start": 64}},
        memory={"peak_bytes": 123456789, "peak_source": "rss_tree",
                "engine_breakdown": {"weights_bytes": 1000, "kv_bytes": 200, "compute_bytes": 30, "total_bytes": 1230}},
        prediction={"fit": {"verdict": "fits"}, "memory": {"total_gib": 0.5},
                    "throughput": {"decode_tok_s": 60.0, "prefill_tok_s": 900.0, "ttft_ms": 300.0}},
        provenance={"engine_version": "test", "host_bandwidth_gbs": 20.0, "started_at": "2026-01-01T00:00:00Z"},
    )


def test_summary_keeps_samples_and_uses_sample_stddev():
    summary = records.summarize([4.0, 1.0, 3.0, 2.0])
    assert summary["samples"] == [4.0, 1.0, 3.0, 2.0]
    assert summary["median"] == 2.5 and summary["mean"] == 2.5 and summary["n"] == 4
    assert summary["stddev"] == pytest.approx(1.2909944, rel=1e-6)
    assert summary["p10"] == pytest.approx(1.3) and summary["p90"] == pytest.approx(3.7)


def test_summary_of_nothing_and_of_non_finite_values():
    assert records.summarize([])["n"] == 0 and records.summarize([])["median"] is None
    assert records.summarize([1.0, float("nan"), None, float("inf")])["samples"] == [1.0]
    assert records.summarize([5.0])["stddev"] == 0.0


def test_config_hash_ignores_volatile_keys_and_prompt_order_but_not_measured_ones():
    base = records.config_hash(config())
    assert records.config_hash(config(prompt_tokens=[64, 256])) == base
    assert records.config_hash(config(timeout_s=5, label="x")) == base
    assert records.config_hash(config(context=2048)) != base
    assert records.config_hash(config(engine_options={"n_gpu_layers": 10, "threads": 2})) != base


def test_new_record_has_id_hash_and_normalized_config():
    record = measured_record()
    records.validate_record(record)
    assert record["id"].split("-")[1] == record["config_hash"][:10]
    assert record["config"]["prompt_tokens"] == [64, 256]
    assert record["config"]["engine"] == "llama.cpp" and record["provenance"]["source"] == "measured"


@pytest.mark.parametrize("breakage", [
    lambda r: r.pop("status"),
    lambda r: r.update(status="fine"),
    lambda r: r.update(schema_version=2),
    lambda r: r["config"].pop("model"),
    lambda r: r.update(id="nope"),
    lambda r: r["measurements"]["prefill"][0].update(ttft_ms={"median": 1}),
    lambda r: r["provenance"].update(source="guessed"),
])
def test_validate_record_rejects_malformed_records(breakage):
    record = measured_record()
    breakage(record)
    with pytest.raises(ValueError):
        records.validate_record(record)


def test_write_record_path_layout_and_no_overwrite(tmp_path):
    first = measured_record()
    path = records.write_record(first, tmp_path)
    assert path == tmp_path / "llama.cpp" / "cpu" / "smollm2-135m" / f"{first['id']}.json"
    clash = measured_record()
    clash["id"] = first["id"]  # same name: a new random suffix is drawn, nothing is overwritten
    second = records.write_record(clash, tmp_path)
    assert second != path and clash["id"] != first["id"]
    assert json.loads(path.read_text())["id"] == first["id"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_write_record_turns_nan_into_null(tmp_path):
    record = measured_record()
    record["measurements"]["load_s"] = float("nan")
    stored = json.loads(records.write_record(record, tmp_path).read_text())
    assert stored["measurements"]["load_s"] is None


def test_iter_records_skips_and_reports_bad_files(tmp_path):
    good = records.write_record(measured_record(), tmp_path)
    (good.parent / "broken.json").write_text("{not json")
    (good.parent / "wrong.json").write_text(json.dumps({"schema_version": 1}))
    (good.parent / ".partial.tmp.json").write_text("{")
    reported = []
    found = list(records.iter_records(tmp_path, on_error=lambda p, m: reported.append(p.name)))
    assert [run.path for run in found] == [good]
    assert sorted(reported) == ["broken.json", "wrong.json"]
    with pytest.warns(UserWarning):
        list(records.iter_records(tmp_path))


def test_runs_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCHCAL_RUNS", str(tmp_path / "env"))
    assert records.runs_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert records.runs_dir() == tmp_path / "env"
    monkeypatch.delenv("BENCHCAL_RUNS")
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path / "home"))
    assert records.runs_dir() == tmp_path / "home" / "runs"


def test_default_runs_dir_is_never_the_shipped_dataset(monkeypatch):
    from predictor.userdata import is_shipped, shipped_runs_dir

    monkeypatch.delenv("BENCHCAL_RUNS", raising=False)
    monkeypatch.delenv("BENCHCAL_HOME", raising=False)
    assert not is_shipped(records.runs_dir())
    assert is_shipped(shipped_runs_dir() / "llama.cpp")


def test_load_runs_flat_columns(tmp_path):
    records.write_record(measured_record(), tmp_path)
    failed = records.new_record(config(context=4096), status="oom", reason="failed to allocate")
    records.write_record(failed, tmp_path)
    frame = record_tables.load_runs(tmp_path)
    assert list(frame.columns)[:len(record_tables.RUN_COLUMNS)] == list(record_tables.RUN_COLUMNS)
    ok = frame[frame.status == "ok"].iloc[0]
    assert ok.prompt_tokens == 256 and ok.prefill_tok_s == pytest.approx(1261.0)
    assert ok.decode_tok_s == 52.0 and ok.decode_tok_s_std == pytest.approx(2.0)
    assert ok.pred_verdict == "fits" and ok.pred_decode_tok_s == 60.0 and ok.pred_memory_total_gib == 0.5
    assert ok.engine_kv_bytes == 200 and ok.n_gpu_layers == 0 and ok.host_bandwidth_gbs == 20.0
    oom = frame[frame.status == "oom"].iloc[0]
    assert oom.reason == "failed to allocate" and oom.context == 4096


def test_load_prefill_points_one_row_per_prompt_length(tmp_path):
    records.write_record(measured_record(), tmp_path)
    points = record_tables.load_prefill_points(tmp_path)
    assert sorted(points.prompt_tokens) == [64, 256]
    assert set(points.columns) == set(record_tables.PREFILL_COLUMNS)


def test_ok_config_hashes_counts_planned_configs(tmp_path):
    measured = measured_record(engine_options={"n_gpu_layers": 20})
    planned_cfg = records.normalize_config(config())
    measured["planned"] = {"config": planned_cfg, "config_hash": records.config_hash(planned_cfg)}
    records.write_record(measured, tmp_path)
    records.write_record(records.new_record(config(context=8192), status="crash"), tmp_path)
    assert records.ok_config_hashes(tmp_path) == {measured["config_hash"], records.config_hash(planned_cfg)}


WRITER = textwrap.dedent("""
    import sys
    from harness import records
    root = sys.argv[1]
    for i in range(50):
        rec = records.new_record({"model": "smollm2-135m", "quant": "Q4_0", "prompt_tokens": [64]},
                                 measurements={"prefill": [{"prompt_tokens": 64,
                                               "ttft_ms": records.summarize([float(i)] * 20),
                                               "prefill_tok_s": records.summarize([1.0] * 20)}]},
                                 log_tail=["x" * 200] * 50)
        records.write_record(rec, root)
""")


def test_eight_concurrent_writers_corrupt_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=env) for _ in range(8)]
    assert all(w.wait(timeout=120) == 0 for w in writers)
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 400
    ids = set()
    for path in files:
        record = json.loads(path.read_text())  # every file is complete, valid JSON
        records.validate_record(record)
        assert path.stem == record["id"]
        ids.add(record["id"])
    assert len(ids) == 400
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".json"]
    assert len(record_tables.load_runs(tmp_path)) == 400
