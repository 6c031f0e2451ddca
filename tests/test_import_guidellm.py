"""``benchcal import guidellm``: GuideLLM's benchmark report becomes one record per load level, with every latency
statistic the file has. The reports under tests/data/serving/guidellm/ are real: GuideLLM 0.3.0 against
llama-cpp-python's server on this project's CPU host (a synthetic 4-layer SmolLM2-135M in Q8_0, 32-token prompts,
32 output tokens, 16 requests a level). The device a test imports them under is the test's label, not theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchcal.cli import main
from calibration.importers_guidellm import as_serve_result, import_guidellm, parse_guidellm

DATA = Path(__file__).parent / "data" / "serving" / "guidellm"
CONCURRENT = DATA / "guidellm-0.3.0-concurrent-1-2-4.json"
POISSON = DATA / "guidellm-0.3.0-poisson-4.json"
SYNCHRONOUS = DATA / "guidellm-0.3.0-synchronous.json"


def _successful(benchmark, name):
    return benchmark["metrics"][name]["successful"]


def test_each_concurrency_level_becomes_a_record_with_the_files_statistics(tmp_path):
    written, messages = import_guidellm(CONCURRENT, model="smollm2-135m", runs_dir=tmp_path, gpu="rtx-4090",
                                        engine="llama.cpp", quant="Q8_0", source_url="https://example.org/run")
    assert len(written) == 3 and messages == []
    benchmarks = parse_guidellm(CONCURRENT.read_text())
    records = sorted((json.loads(p.read_text()) for p in written), key=lambda r: r["config"]["batch"])
    assert [r["config"]["batch"] for r in records] == [1, 2, 4]
    for record, benchmark in zip(records, benchmarks, strict=True):
        serve = record["measurements"]["serve"]
        assert serve["max_concurrency"] == benchmark["args"]["strategy"]["streams"]
        assert serve["guidellm_strategy"] == "concurrent" and not record.get("batch_estimated")
        ttft, itl = _successful(benchmark, "time_to_first_token_ms"), _successful(benchmark, "inter_token_latency_ms")
        e2e = _successful(benchmark, "request_latency")
        assert serve["ttft_ms"]["median"] == ttft["median"] and serve["ttft_ms"]["p99"] == ttft["percentiles"]["p99"]
        assert serve["tpot_ms"]["p90"] == itl["percentiles"]["p90"]  # vLLM's TPOT is GuideLLM's ITL
        assert serve["e2el_ms"]["p50"] == pytest.approx(1000 * e2e["percentiles"]["p50"])
        assert serve["guidellm_tpot_ms"]["median"] == _successful(benchmark, "time_per_output_token_ms")["median"]
        assert serve["completed"] == 16 and serve["total_output_tokens"] == 512
        assert record["measurements"]["decode"]["decode_tok_s"]["median"] == pytest.approx(1000 / itl["median"])
        assert record["measurements"]["prefill"][0]["prompt_tokens"] == 32
        assert record["config"]["engine"] == "llama.cpp" and record["config"]["kv_dtype"] == "f16"
        assert record["config"]["quant"] == "Q8_0" and record["config"]["gen_tokens"] == 32
        assert record["provenance"]["import_format"] == "guidellm benchmark"
        assert record["provenance"]["source_url"] == "https://example.org/run"
    again, messages = import_guidellm(CONCURRENT, model="smollm2-135m", runs_dir=tmp_path, gpu="rtx-4090",
                                      engine="llama.cpp", quant="Q8_0")
    assert again == [] and all("already imported" in m for m in messages)


def test_a_rate_level_keeps_its_rate_and_estimates_the_batch(tmp_path):
    written, messages = import_guidellm(POISSON, model="smollm2-135m", runs_dir=tmp_path, gpu="rtx-4090",
                                        engine="llama.cpp", quant="Q8_0")
    record = json.loads(written[0].read_text())
    assert record["measurements"]["serve"]["request_rate"] == 4.0 and "max_concurrency" not in record["measurements"]["serve"]
    assert record["batch_estimated"] and "Little's law" in messages[0]
    (benchmark,) = parse_guidellm(POISSON.read_text())
    rate, e2e = _successful(benchmark, "requests_per_second"), _successful(benchmark, "request_latency")
    assert record["config"]["batch"] == max(1, round(rate["mean"] * e2e["mean"]))


def test_synchronous_is_one_request_in_flight_and_vllm_is_the_default_engine(tmp_path):
    (benchmark,) = parse_guidellm(SYNCHRONOUS.read_text())
    assert as_serve_result(benchmark, 0)["max_concurrency"] == 1
    assert main(["import", "guidellm", str(SYNCHRONOUS), "--model", "qwen2.5-0.5b", "--gpu", "l40s",
                 "--runs-dir", str(tmp_path)]) == 0
    (path,) = tmp_path.rglob("*.json")
    record = json.loads(path.read_text())
    assert record["config"]["engine"] == "vllm" and record["config"]["batch"] == 1
    assert record["config"]["device"] == "l40s"


def test_a_benchmark_without_a_fixed_load_is_refused_before_anything_is_written(tmp_path):
    data = json.loads(CONCURRENT.read_text())
    data["benchmarks"][2]["args"]["strategy"] = {"type_": "throughput"}
    bad = tmp_path / "mixed.json"
    bad.write_text(json.dumps(data))
    runs = tmp_path / "runs"
    with pytest.raises(Exception, match="benchmark 3: a 'throughput' load"):
        import_guidellm(bad, model="smollm2-135m", runs_dir=runs, gpu="rtx-4090")
    assert not list(runs.rglob("*.json"))
