"""Real servers under load on the CPU: llama-cpp-python's server and vLLM's, with small synthetic models (every
figure here comes from a real server; nothing is made up)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from harness import records
from harness.serving.run import run_serving

pytestmark = pytest.mark.engine

LLAMA = {"model": "smollm2-135m", "engine": "llama.cpp", "device": "cpu", "quant": "Q8_0", "context": 512,
         "prompt_tokens": [32], "gen_tokens": 8, "arch_overrides": {"num_layers": 4, "vocab_size": 4096},
         "engine_options": {"threads": 1}}


def _closed(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


SECRET = "benchcal-planted-secret-5f1c9e"  # planted in the environment: no record or log may hold it
LISTENERS: dict[str, list] = {}


def _listeners(name: str):
    """``on_ready`` hook: every listening TCP socket of the server's process tree."""
    def look(server) -> None:
        import psutil

        pids = server.pids()
        LISTENERS[name] = [c.laddr for c in psutil.net_connections(kind="inet")
                           if c.status == psutil.CONN_LISTEN and c.pid in pids]
    return look


@pytest.fixture(scope="module")
def llama_run(cache, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY"):
            patch.setenv(name, SECRET)
        return run_serving({**LLAMA, "serve": {"server": "llama-cpp-python", "concurrency": [1, 2], "requests": 4,
                                               "warmup": 1}}, runs,
                           say=lambda m: None, on_ready=_listeners("llama.cpp"))


def test_the_server_listens_on_loopback_only_and_no_secret_reaches_the_record_or_log(llama_run):
    record, path = llama_run
    assert LISTENERS["llama.cpp"] and all(addr.ip == "127.0.0.1" for addr in LISTENERS["llama.cpp"])
    assert SECRET not in Path(path).read_text()
    assert SECRET not in Path(record["provenance"]["log_file"]).read_text(errors="replace")


def test_llama_cpp_server_is_measured_at_each_concurrency_and_stopped(llama_run):
    record, path = llama_run
    stored = json.loads(Path(path).read_text())
    records.validate_record(stored)
    assert stored["status"] == "ok" and stored["config"]["serve"]["concurrency"] == [1, 2]
    serving = stored["measurements"]["serving"]
    assert serving["prompt_tokens"] == 32 and serving["output_tokens"] == 8 and serving["startup_s"] > 0
    one, two = serving["levels"]
    for level in (one, two):
        assert level["completed"] == 4 and level["errors"] == level["timeouts"] == 0
        assert level["output_tokens"] == 4 * 8 and level["output_tok_s"] > 0
        assert len(level["ttft_ms"]["samples"]) == 4 and len(level["itl_ms"]["samples"]) == 4 * 7
        assert level["server_metrics"] is None  # llama_cpp.server has no /metrics
    # one Llama serves requests in turn: at concurrency 2 a request waits for the one before it
    assert two["ttft_ms"]["mean"] > one["ttft_ms"]["mean"]
    assert stored["memory"]["peak_bytes"] > 0 and stored["memory"]["peak_source"] == "rss_tree"
    assert stored["provenance"]["engine_version"].startswith("llama-cpp-python")
    assert _closed(serving["port"])


def test_levels_run_in_interleaved_rounds_are_summed_and_each_round_kept(cache, tmp_path):
    from calibration.serving import level_figures

    record, _ = run_serving({**LLAMA, "serve": {"server": "llama-cpp-python", "concurrency": [2], "request_rate": [20],
                                                "requests": 3, "rounds": 2, "warmup": 0}}, tmp_path / "runs",
                            say=lambda m: None)
    assert record["status"] == "ok", record["reason"]
    for level in record["measurements"]["serving"]["levels"]:
        rounds = level["rounds"]
        assert level["completed"] == 6 and len(level["ttft_ms"]["samples"]) == 6
        assert [r["completed"] for r in rounds] == [3, 3]
        # the level's throughput is over its rounds' wall time together
        assert level["duration_s"] == pytest.approx(sum(r["duration_s"] for r in rounds))
        assert level["output_tok_s"] == pytest.approx(level["output_tokens"] / level["duration_s"])
        # the fit reads the median of the rounds' own figures
        figures = level_figures(level)
        assert figures["ttft_ms"] == pytest.approx((rounds[0]["ttft_p50_ms"] + rounds[1]["ttft_p50_ms"]) / 2)
        assert figures["output_tok_s"] == pytest.approx((rounds[0]["output_tok_s"] + rounds[1]["output_tok_s"]) / 2)
        # each round's requests in the order sent: when, TTFT and end-to-end, the samples the level summarizes
        timeline = level["timeline_ms"]
        assert [len(t) for t in timeline] == [3, 3] and all(t[0][0] == 0.0 for t in timeline)
        assert all(a[0] <= b[0] for t in timeline for a, b in zip(t, t[1:]))
        assert sorted(r[1] for t in timeline for r in t) == pytest.approx(level["ttft_ms"]["samples"], abs=1e-3)
        assert sorted(r[2] for t in timeline for r in t) == pytest.approx(level["e2el_ms"]["samples"], abs=1e-3)
        # a closed loop sends its next request when one ends
        if level["concurrency"] == 2:
            for t in timeline:
                ends = sorted(sent + e2el for sent, _, e2el in t[:2])
                assert t[2][0] == pytest.approx(ends[0], abs=5.0)
    rate = record["measurements"]["serving"]["levels"][1]
    assert rate["request_rate"] == 20 and rate["arrival_seed"] is not None  # one draw, replayed in each round


def _drawn(record) -> list[tuple[int, int]]:
    """Each level's prompt and output tokens over its rounds, as the run drew them from the record's seed."""
    import random

    from harness.serving.config import level_requests, request_lengths

    serve, serving = record["config"]["serve"], record["measurements"]["serving"]
    counts = [level_requests(serve, level["request_rate"], level["concurrency"]) for level in serving["levels"]]
    total = serve["warmup"] + sum(counts) * serve["rounds"]
    draw = random.Random(serving["seed"])
    prompts = request_lengths(serving["prompt_tokens"], serving["range_ratio"], total, draw)
    outputs = request_lengths(serving["output_tokens"], serving["range_ratio"], total, draw)
    taken: list[list[int]] = [[] for _ in counts]  # the payloads each level sent: warm-up first, then round by round
    offset = serve["warmup"]
    for _turn in range(serve["rounds"]):
        for k, count in enumerate(counts):
            taken[k] += range(offset, offset + count)
            offset += count
    return [(sum(prompts[i] for i in sent), sum(outputs[i] for i in sent)) for sent in taken]


def test_a_range_ratio_sends_each_request_the_lengths_drawn_for_it(cache, tmp_path):
    # a request count per concurrency level, in the order of the levels given: 2 in flight send 6, 1 in flight 2
    record, _ = run_serving({**LLAMA, "serve": {"server": "llama-cpp-python", "concurrency": [2, 1],
                                                "request_rate": [50], "requests": [6, 2], "rate_requests": 3,
                                                "rounds": 2, "warmup": 1, "range_ratio": 0.5}},
                            tmp_path / "runs", say=lambda m: None)
    assert record["status"] == "ok", record["reason"]
    serving = record["measurements"]["serving"]
    assert serving["range_ratio"] == 0.5 and record["config"]["serve"]["range_ratio"] == 0.5
    # 16-48 prompt and 4-12 output tokens a request: the server generated exactly the tokens drawn for each, and the
    # prompts are the lengths drawn (the server's tokenizer sized them); each level sends its own count
    assert record["config"]["serve"]["concurrency"] == [1, 2] and record["config"]["serve"]["requests"] == [2, 6]
    for level, (prompts, outputs), count in zip(serving["levels"], _drawn(record), (4, 12, 6), strict=True):
        assert level["completed"] == count and [r["completed"] for r in level["rounds"]] == [count // 2] * 2
        assert level["output_tokens"] == outputs and level["prompt_tokens"] == prompts
        assert len(level["itl_ms"]["samples"]) == outputs - count
        assert outputs != count * 8 or prompts != count * 32
    # the serving model is of fixed lengths: a run that drew them is measured, not fitted
    from calibration.serving import fit_serving

    assert fit_serving([tmp_path / "runs"]) == {}


def test_llama_server_batches_its_slots_where_a_binary_exists(cache, tmp_path):
    from calibration.serving import fit_serving
    from harness.engines.llama_cpp.server import find_llama_server

    if find_llama_server() is None:
        pytest.skip("no llama-server binary here (on PATH or BENCHCAL_LLAMA_SERVER)")
    record, path = run_serving({**LLAMA, "serve": {"concurrency": [1, 2, 4], "requests": 8, "warmup": 1}},
                               tmp_path / "runs", say=lambda m: None, on_ready=_listeners("llama-server"))
    assert record["status"] == "ok", record["reason"]
    assert record["config"]["serve"]["server"] == "llama-server"  # the default where one exists
    assert LISTENERS["llama-server"] and all(a.ip == "127.0.0.1" for a in LISTENERS["llama-server"])
    assert record["provenance"]["engine_version"].startswith("llama-server")
    for level in record["measurements"]["serving"]["levels"]:
        assert level["completed"] == 8 and level["output_tokens"] == 8 * 8
        # its own counters agree with what the client received
        assert level["server_metrics"]["generation_tokens"] == 64 and level["server_metrics"]["prompt_tokens"] == 8 * 32
    # fitted as a batching server, under its own name: not with llama-cpp-python's one-at-a-time server
    fits = fit_serving([tmp_path / "runs"])
    assert "llama.cpp" not in fits and next(iter(fits["llama-server"].values()))["mode"] == "continuous"
    assert _closed(record["measurements"]["serving"]["port"])


def test_a_server_that_cannot_start_is_a_failed_record_with_its_log(cache, tmp_path):
    # a GGUF whose tokenizer model llama.cpp does not know ("unknown tokenizer") passes every check before the run
    # (the model's shapes are whole) and makes llama.cpp's loader fail: the server exits while loading
    from harness.runconfig import prepare_config, prepare_weights

    whole, _ = prepare_weights(prepare_config({**LLAMA, "serve": {"server": "llama-cpp-python"}}))
    data = Path(whole).read_bytes()
    key = b"tokenizer.ggml.model"
    at = data.index(key) + len(key)
    value = data.index(b"llama", at)  # the value follows the key's type and length
    broken = tmp_path / "unknown-tokenizer.gguf"
    broken.write_bytes(data[:value] + b"llamx" + data[value + 5:])
    record, path = run_serving({**LLAMA, "weights": str(broken), "model_source": "path",
                                "serve": {"server": "llama-cpp-python", "requests": 1}}, tmp_path / "runs",
                               say=lambda m: None)
    assert record["status"] == "crash" and "before it answered" in record["reason"]
    assert record["log_tail"] and Path(path).is_file()
    assert any("unknown tokenizer: 'llamx'" in line for line in record["log_tail"])  # llama.cpp's own reason
    assert _closed(record["measurements"]["serving"]["port"])


@pytest.mark.vllm
def test_vllm_server_batches_concurrent_requests(cache, tmp_path):
    pytest.importorskip("vllm")
    cfg = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "context": 512, "prompt_tokens": [32],
           "gen_tokens": 8, "arch_overrides": {"num_layers": 2, "vocab_size": 4096}, "engine_options": {"threads": 2},
           "serve": {"concurrency": [1, 4], "requests": 4, "rounds": 2, "warmup": 1, "range_ratio": 0.25}}
    record, path = run_serving(cfg, tmp_path / "runs", say=lambda m: None, on_ready=_listeners("vllm"))
    assert record["status"] == "ok", record["reason"]
    # the API server and its engine processes listen on loopback only
    assert LISTENERS["vllm"] and all(addr.ip == "127.0.0.1" for addr in LISTENERS["vllm"]), LISTENERS["vllm"]
    one, four = record["measurements"]["serving"]["levels"]
    for level, (prompts, outputs) in zip((one, four), _drawn(record), strict=True):  # two rounds of four requests
        # each request's lengths drawn from 24-40 prompt and 6-10 output tokens (range_ratio 0.25)
        assert level["completed"] == 8 and level["output_tokens"] == outputs and level["prompt_tokens"] == prompts
        assert [r["completed"] for r in level["rounds"]] == [4, 4]
        # vLLM's own counters, over both rounds, agree with what the client received
        assert level["server_metrics"]["generation_tokens"] == outputs
        assert level["server_metrics"]["prompt_tokens"] == prompts
    assert record["config"]["batch"] == 4  # max_num_seqs: the most sequences in flight
    assert _closed(record["measurements"]["serving"]["port"])
    # the engine's threads sleep at their barriers: the front-end and the client share the host's cores
    assert record["provenance"]["server_env"] == {"OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}


def test_the_vllm_server_on_a_cpu_waits_passively_unless_told_otherwise():
    from harness.engines.vllm.server import VllmServer

    cpu = {"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "engine_options": {"threads": 2}}
    assert VllmServer().environment(cpu, {})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert VllmServer().environment(cpu, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert "OMP_WAIT_POLICY" not in VllmServer().environment({**cpu, "device": "h100-sxm"}, {})
