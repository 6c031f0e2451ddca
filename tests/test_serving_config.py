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
    assert normalize_serve({}) == {"concurrency": [1], "request_rate": [], "requests": 16, "rounds": 1, "warmup": 2,
                                   "duration_s": 300.0, "request_timeout_s": 300.0, "max_num_seqs": 1}
    serve = normalize_serve({"concurrency": [4, 1, 2, 2], "request_rate": [0.5]})
    assert serve["concurrency"] == [1, 2, 4] and serve["request_rate"] == [0.5] and serve["max_num_seqs"] == 4
    assert normalize_serve({"request_rate": 2})["max_num_seqs"] == 16
    cfg = prepare_config({**BASE, "serve": {"concurrency": [1, 8]}})
    assert cfg["batch"] == 8 and cfg["serve"]["concurrency"] == [1, 8]


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
    ("4", "serve: '4' is not of type 'object'"),
])
def test_a_bad_serve_table_is_refused_by_name(serve, message):
    with pytest.raises(BenchcalError, match=message):
        prepare_config({**BASE, "serve": serve})


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
