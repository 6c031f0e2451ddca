"""A serving run's configuration: the serve table checked up front, the engine's server command, vLLM's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.engines import engine_setup
from harness.engines.vllm.server import server_flags
from harness.runconfig import prepare_config
from harness.serving.config import normalize_serve
from harness.serving.server import free_port, parse_metrics
from predictor.errors import BenchcalError

DATA = Path(__file__).parent / "data" / "serving"
BASE = {"model": "smollm2-135m", "engine": "llama.cpp", "device": "cpu", "quant": "Q8_0", "context": 512,
        "prompt_tokens": [32], "gen_tokens": 8, "engine_options": {"threads": 1}}


def test_the_serve_table_gets_its_defaults_and_sizes_the_batch():
    assert normalize_serve({}) == {"server": None, "concurrency": [1], "request_rate": [], "requests": 16, "rounds": 1,
                                   "warmup": 2,
                                   "duration_s": 300.0, "request_timeout_s": 300.0, "max_num_seqs": 1}
    serve = normalize_serve({"concurrency": [4, 1, 2, 2], "request_rate": [0.5]})
    assert serve["concurrency"] == [1, 2, 4] and serve["request_rate"] == [0.5] and serve["max_num_seqs"] == 4
    assert normalize_serve({"request_rate": 2})["max_num_seqs"] == 16
    cfg = prepare_config({**BASE, "serve": {"concurrency": [1, 8]}})
    assert cfg["batch"] == 8 and cfg["serve"]["concurrency"] == [1, 8]


def test_a_serve_table_can_give_each_concurrency_level_its_own_request_count():
    from harness.serving.config import level_requests

    # one per level, in the order the levels are given; kept in the order they run (ascending)
    serve = normalize_serve({"concurrency": [8, 1, 4], "requests": [32, 8, 16], "request_rate": [2],
                             "rate_requests": 4})
    assert serve["concurrency"] == [1, 4, 8] and serve["requests"] == [8, 16, 32]
    assert [level_requests(serve, None, c) for c in (1, 4, 8)] == [8, 16, 32] and level_requests(serve, 2.0) == 4
    assert normalize_serve({"concurrency": [2, 2, 1], "requests": [6, 6, 3]})["requests"] == [3, 6]
    assert normalize_serve(serve) == serve  # a record's table reads back the same
    assert level_requests(normalize_serve({"concurrency": [1, 2], "requests": 5}), None, 2) == 5


@pytest.mark.parametrize("serve,message", [
    ({"concurrency": [0]}, "serve.concurrency must hold positive integers"),
    ({"concurrency": [1.5]}, "serve.concurrency must hold positive integers"),
    ({"request_rate": ["fast"]}, "serve.request_rate must hold numbers"),
    ({"request_rate": [float("inf")]}, "serve.request_rate must hold positive numbers"),
    ({"requests": 0}, "serve.requests must be positive"),
    ({"warmup": -1}, "serve.warmup must be zero or positive"),
    ({"rounds": 0}, "serve.rounds must be positive"),
    ({"rounds": 1.5}, "serve.rounds must be"),
    ({"users": 3}, "serve has no option 'users'"),
    ({"rate_requests": 0}, "serve.rate_requests must be positive"),
    ({"concurrency": [1, 2], "requests": [8]}, r"serve.requests has 1 number\(s\) for 2 concurrency level"),
    ({"concurrency": [1, 2], "requests": [8, 0]}, "serve.requests must hold positive integers"),
    ({"concurrency": [1, 1], "requests": [8, 16]}, "serve.requests gives concurrency 1 two request counts"),
    ({"concurrency": [1], "request_rate": [2], "requests": [8]}, "set serve.rate_requests for the request-rate"),
    ({"range_ratio": 1}, "serve.range_ratio must be below 1"),
    ({"range_ratio": -0.2}, "serve.range_ratio must be zero or positive"),
    ({"range_ratio": "wide"}, "serve.range_ratio must be a number"),
    ({"server": 3}, "serve.server must be a server's name"),
    ({"server": "vllm"}, "serve.server 'vllm' does not serve llama.cpp"),
    ("4", "serve: '4' is not of type 'object'"),
])
def test_a_bad_serve_table_is_refused_by_name(serve, message):
    with pytest.raises(BenchcalError, match=message):
        prepare_config({**BASE, "serve": serve})


def test_a_range_ratio_draws_each_requests_lengths_around_the_runs_as_vllm_bench_does():
    import random

    from harness import records
    from harness.serving.config import request_lengths

    # vllm bench serve --random-range-ratio 0.5 around 32 tokens: 16 to 48, uniformly
    drawn = request_lengths(32, 0.5, 2000, random.Random(7))
    assert min(drawn) == 16 and max(drawn) == 48 and 31 < sum(drawn) / len(drawn) < 33
    assert drawn == request_lengths(32, 0.5, 2000, random.Random(7))  # the record's seed replays it
    assert request_lengths(3, 0.9, 50, random.Random(1)) and min(request_lengths(3, 0.9, 50, random.Random(1))) == 1
    # without one every request is the run's length, and the draw is not touched (the prompts stay as before)
    rng = random.Random(7)
    assert request_lengths(32, 0.0, 5, rng) == [32] * 5 and rng.random() == random.Random(7).random()
    # the option is kept only where it draws: a serve table without it is the same run as before
    assert "range_ratio" not in prepare_config({**BASE, "serve": {}})["serve"]
    wide = prepare_config({**BASE, "serve": {"range_ratio": 0.5}})
    assert wide["serve"]["range_ratio"] == 0.5
    assert records.config_hash(wide) != records.config_hash(prepare_config({**BASE, "serve": {}}))


def test_an_engine_without_a_server_or_a_run_without_tokens_is_refused_before_anything_runs():
    with pytest.raises(BenchcalError, match="transformers engine has no server"):
        prepare_config({**BASE, "engine": "transformers", "quant": None, "serve": {}})
    with pytest.raises(BenchcalError, match="at least one token"):
        prepare_config({**BASE, "gen_tokens": 0, "serve": {}})


def test_the_serve_table_is_part_of_what_a_run_measured():
    from harness import records

    assert records.config_hash(prepare_config(BASE)) != records.config_hash(prepare_config({**BASE, "serve": {}}))


def test_llama_cpp_serves_one_request_at_a_time_without_cutting_the_stream_short():
    cfg = prepare_config({**BASE, "serve": {}})
    command = engine_setup("llama.cpp").server().command(cfg, "/models/m.gguf", 8123)
    flags = dict(zip(command[3::2], command[4::2]))
    assert command[1:3] == ["-m", "llama_cpp.server"] and flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--interrupt_requests"] == "false" and flags["--n_ctx"] == "512" and flags["--n_threads"] == "1"
    payload = engine_setup("llama.cpp").server().payload("abc", 8)
    assert payload["min_tokens"] == payload["max_tokens"] == 8 and payload["stream"]


def test_vllm_gets_the_offline_engines_options_as_flags():
    flags = server_flags({"model": "/m", "skip_tokenizer_init": True, "enable_prefix_caching": False,
                          "enforce_eager": False, "kv_cache_memory_bytes": None, "max_num_seqs": 4,
                          "disable_log_stats": False, "trust_remote_code": False})
    assert flags == ["--model", "/m", "--skip-tokenizer-init", "--no-enable-prefix-caching", "--max-num-seqs", "4"]
    payload = engine_setup("vllm").server().payload([1, 2, 3], 5)
    assert payload["ignore_eos"] and payload["min_tokens"] == 5 and payload["stream_options"]["include_usage"]


def test_vllm_metrics_are_read_from_its_prometheus_text():
    metrics = parse_metrics((DATA / "vllm_server_metrics.txt").read_text())
    assert metrics["vllm:generation_tokens_total"] == 5.0 and metrics["vllm:prompt_tokens_total"] == 8.0
    assert metrics["vllm:num_requests_running"] == 0.0 and "vllm:kv_cache_usage_perc" in metrics


def test_a_free_port_is_on_loopback():
    assert 1024 <= free_port() <= 65535


@pytest.fixture
def no_llama_server(monkeypatch, tmp_path):
    """A PATH without llama-server and no BENCHCAL_LLAMA_SERVER."""
    monkeypatch.delenv("BENCHCAL_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def test_llama_cpp_is_served_by_llama_server_where_one_exists(no_llama_server, monkeypatch, tmp_path):
    assert prepare_config({**BASE, "serve": {}})["serve"]["server"] == "llama-cpp-python"
    with pytest.raises(BenchcalError, match="no llama-server binary"):
        prepare_config({**BASE, "serve": {"server": "llama-server"}})
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv("BENCHCAL_LLAMA_SERVER", str(binary))
    with pytest.raises(BenchcalError, match="is not an executable file"):
        prepare_config({**BASE, "serve": {}})
    binary.chmod(0o755)
    cfg = prepare_config({**BASE, "serve": {"concurrency": [1, 4]}})
    assert cfg["serve"]["server"] == "llama-server"
    # asked for by name, the bindings' server is still there
    assert prepare_config({**BASE, "serve": {"server": "llama-cpp-python"}})["serve"]["server"] == "llama-cpp-python"
    server = engine_setup("llama.cpp").server(cfg)
    command = server.command(cfg, "/models/m.gguf", 8123)
    assert command[0] == str(binary) and "--kv-unified" in command and "--metrics" in command
    flags = {a: b for a, b in zip(command[1:], command[2:]) if a.startswith("--")}
    # four slots (the highest concurrency), each with the run's whole context in one unified cache
    assert flags["--parallel"] == "4" and flags["--ctx-size"] == str(4 * 512) and flags["--host"] == "127.0.0.1"
    assert flags["--threads"] == "1" and flags["--flash-attn"] == "off" and flags["--cache-type-k"] == "f16"
    payload = server.payload([5, 6, 7], 8)
    assert payload["ignore_eos"] and payload["max_tokens"] == 8 and payload["prompt"] == [5, 6, 7]
    assert payload["stream"] and payload["stream_options"]["include_usage"] and not payload["cache_prompt"]
    assert server.ready_path == "/health" and server.metrics_path == "/metrics"


def test_llama_server_metrics_and_version_are_read_from_its_own_output():
    from harness.engines.llama_cpp.server import parse_llama_server_version

    metrics = parse_metrics((DATA / "llama_server_metrics.txt").read_text())
    assert metrics["llamacpp:tokens_predicted_total"] == 4.0 and metrics["llamacpp:prompt_tokens_total"] == 8.0
    assert metrics["llamacpp:requests_processing"] == 0.0 and metrics["llamacpp:requests_deferred"] == 0.0
    # a build from a source tarball: version, build 1 (no git checkout: no build number) and commit
    version = parse_llama_server_version((DATA / "llama_server_version.txt").read_text())
    assert version == {"engine_version": "llama-server 0.5.0-dev (build 1)", "engine_build": None,
                       "engine_commit": "0c1e570"}
    assert parse_llama_server_version("no version here") == {}
