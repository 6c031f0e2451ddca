"""vLLM benchmark importer on a real public ``--save-result`` file (tests/data/imported/vllm-bench-serve)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.importers_vllm import import_vllm_bench, parse_vllm_results, result_kind, serve_batch
from calibration.observations import load_observations
from harness import records
from predictor.errors import BenchcalError

SERVE = Path(__file__).parent / "data" / "imported" / "vllm-bench-serve" / "results.json"


def test_json_lines_file_gives_every_result():
    results = parse_vllm_results(SERVE.read_text())
    assert len(results) == 9
    assert {result_kind(r) for r in results} == {"serve"}


def test_serve_results_become_ttft_and_decode_records(tmp_path):
    written, messages = import_vllm_bench(SERVE, model="llama-3.2-3b", runs_dir=tmp_path, gpu="l40s")
    assert len(written) == 9
    assert all("Little's law" in m for m in messages)
    first = json.loads(SERVE.read_text().splitlines()[0])
    obs = load_observations(tmp_path)
    row = obs.decode.loc[obs.decode["decode_tok_s"].sub(1000.0 / first["median_tpot_ms"]).abs().idxmin()]
    assert row["decode_tok_s"] == pytest.approx(1000.0 / first["median_tpot_ms"])
    assert row["engine"] == "vllm" and row["device"] == "l40s"
    assert obs.prefill["ttft_s"].notna().all() and obs.prefill["prefill_s"].isna().all()
    stored = [s.record for s in records.iter_records(tmp_path)]
    assert all(r["batch_estimated"] for r in stored)
    assert {r["provenance"]["import_format"] for r in stored} == {"vllm bench serve"}


def test_batch_comes_from_max_concurrency_when_set():
    result = json.loads(SERVE.read_text().splitlines()[0])
    assert serve_batch({**result, "max_concurrency": 1}) == (1, False)
    batch, estimated = serve_batch(result)
    assert estimated and batch > 1


def test_gpu_is_read_from_the_file_metadata(tmp_path):
    written, _ = import_vllm_bench(SERVE, model="llama-3.2-3b", runs_dir=tmp_path)
    assert {s.record["config"]["device"] for s in records.iter_records(tmp_path)} == {"l40s"}
    assert len(written) == 9


def test_latency_results_need_their_lengths(tmp_path):
    latency = tmp_path / "latency.json"
    latency.write_text(json.dumps({"avg_latency": 0.5, "latencies": [0.49, 0.5, 0.51], "percentiles": {}}))
    with pytest.raises(BenchcalError, match="--input-len"):
        import_vllm_bench(latency, model="llama-3.2-3b", runs_dir=tmp_path / "runs", gpu="l40s")


def test_unrecognised_json_is_a_user_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(BenchcalError, match="unrecognised"):
        import_vllm_bench(bad, model="llama-3.2-3b", runs_dir=tmp_path / "runs", gpu="l40s")


def test_a_json_file_of_non_objects_is_a_user_error(tmp_path):
    path = tmp_path / "numbers.json"
    path.write_text("[1, 2]")
    with pytest.raises(BenchcalError, match="expected a JSON object"):
        import_vllm_bench(path, model="llama-3.2-3b", runs_dir=tmp_path / "runs", gpu="l40s")


def test_a_serve_result_keeps_its_load_and_every_latency_statistic(tmp_path):
    source = Path(__file__).parent / "data" / "imported" / "vllm-bench-serve" / "results.json"
    paths, _ = import_vllm_bench(source, model="llama-3.2-3b", runs_dir=tmp_path, gpu="l40s")
    serve = [json.loads(Path(p).read_text())["measurements"]["serve"] for p in paths]
    first = serve[0]
    assert first["request_rate"] == 10.0 and first["max_concurrency"] is None and first["completed"] == 300
    assert first["ttft_ms"] == {"mean": 54.59561144333596, "median": 52.868896000063614, "std": 10.45418108071603,
                                "p99": 98.69780922984769}
    assert set(first) >= {"tpot_ms", "itl_ms", "output_throughput", "total_token_throughput"}
    assert first["itl_ms"]["p99"] == 34.48662216016601
    assert any(s["request_rate"] == "inf" for s in serve)  # vLLM's "as fast as possible", kept as written
