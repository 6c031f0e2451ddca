"""A server benchcal did not start (``bench --serve --endpoint``): the endpoint's checks, the API key that is sent
and written nowhere, and a real llama-cpp-python server on loopback, started with an API key, driven as a user's
server is (every figure from the real server)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serving.external import normalize_external, parse_endpoint, served_quant
from harness.serving.httpstream import post_stream
from predictor.errors import BenchcalError

ROOT = Path(__file__).resolve().parents[1]
KEY = "bc-test-key-7d2e41a9f0"  # the server's API key: nothing benchcal writes may hold it


@pytest.mark.parametrize("url, why", [
    ("ftp://127.0.0.1/v1", "http://HOST:PORT/v1"),
    ("http://127.0.0.1:8000", "ending in /v1"),
    ("http://127.0.0.1:8000/v2", "ending in /v1"),
    ("http://me:secret@127.0.0.1:8000/v1", "must not hold credentials"),
    ("http://127.0.0.1:8000/v1?key=secret", "no query"),
    ("http://10.1.2.3:8000/v1", "plain HTTP to a host other than loopback"),
    ("http://gpu-box.example:8000/v1", "plain HTTP to a host other than loopback"),
    ("http://127.0.0.1:99999/v1", "is not a URL"),
])
def test_an_endpoint_that_cannot_be_used_is_refused_with_its_reason(url, why):
    with pytest.raises(BenchcalError, match=why) as caught:
        parse_endpoint(url, environ={})
    assert "secret" not in str(caught.value)


def test_loopback_may_be_plain_http_and_another_host_needs_https_or_the_users_leave():
    for host in ("127.0.0.1", "localhost", "127.0.0.7", "[::1]"):
        assert parse_endpoint(f"http://{host}:8000/v1", environ={}).loopback
    remote = parse_endpoint("https://gpu-box.example/proxy/v1/", environ={})
    assert (remote.secure, remote.loopback, remote.root, remote.api) == (
        True, False, "https://gpu-box.example", "https://gpu-box.example/proxy/v1")
    assert not parse_endpoint("http://10.1.2.3:8000/v1", allow_insecure=True, environ={}).secure


def test_the_api_key_comes_from_the_variable_named_and_is_written_nowhere():
    endpoint = parse_endpoint("https://gpu-box.example/v1", api_key_env="MY_KEY", environ={"MY_KEY": KEY})
    assert endpoint.headers() == {"Authorization": f"Bearer {KEY}"}
    assert KEY not in repr(endpoint) and KEY not in json.dumps(endpoint.describe())
    assert endpoint.redact_all({"error": [f"HTTP 401: bad key {KEY}"]}) == {"error": ["HTTP 401: bad key <$MY_KEY>"]}
    with pytest.raises(BenchcalError, match="MY_KEY: that environment variable is not set"):
        parse_endpoint("https://gpu-box.example/v1", api_key_env="MY_KEY", environ={})
    with pytest.raises(BenchcalError, match="name of an environment variable"):
        parse_endpoint("https://gpu-box.example/v1", api_key_env=KEY + "=x", environ={})
    # the serve table keeps the variable's name only, and checks it without reading it
    table = normalize_external({"endpoint": "https://gpu-box.example/v1", "api_key_env": "MY_KEY"})
    assert table == {"endpoint": "https://gpu-box.example/v1", "api_key_env": "MY_KEY", "allow_insecure": False,
                     "served_model": None}


def test_the_format_is_asked_for_or_read_from_the_model_id():
    info = {"engine": "llama.cpp", "served_model": "/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"}
    assert served_quant(info, None) == "Q4_K_M"
    assert served_quant({"engine": "vllm", "served_model": "Qwen/Qwen2.5-7B-Instruct-AWQ"}, None) == "AWQ"
    assert served_quant({"engine": "vllm", "served_model": "meta-llama/Llama-3.1-8B-Instruct"}, "BF16") == "BF16"
    with pytest.raises(BenchcalError, match="--quant"):
        served_quant({"engine": "vllm", "served_model": "meta-llama/Llama-3.1-8B-Instruct"}, None)


# ------------------------------------------------------------------------------------ https, with a key

def _certificate(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return key, cert


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_a_stream_over_tls_is_read_with_the_key_sent_as_a_bearer_token(tmp_path, monkeypatch):
    # a TLS listener that answers one streamed response and keeps the request it got: the client's transport,
    # not an engine (no figure of it is a measurement)
    key, cert = _certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the test's own authority, as a user's private CA would be
    got: dict[str, bytes] = {}

    async def handle(reader, writer):
        got["request"] = await reader.readuntil(b"\r\n\r\n")
        body = b"data: {\"choices\": [{\"text\": \"a\"}]}\n\ndata: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await post_stream(f"https://localhost:{port}/v1/completions", {"prompt": "x"},
                                     {"Authorization": f"Bearer {KEY}"})

    status, _headers, pieces = asyncio.run(main())
    assert status == 200 and b"[DONE]" in b"".join(data for _, data in pieces)
    assert f"Authorization: Bearer {KEY}".encode() in got["request"]


# ----------------------------------------------------------------------- a real server on loopback

LLAMA = {"model": "smollm2-135m", "engine": "llama.cpp", "device": "cpu", "quant": "Q8_0", "context": 512,
         "prompt_tokens": [32], "gen_tokens": 8, "arch_overrides": {"num_layers": 4, "vocab_size": 4096},
         "engine_options": {"threads": 1}, "serve": {"server": "llama-cpp-python"}}


@pytest.fixture(scope="module")
def keyed_server(probed_cache, tmp_path_factory):
    """llama-cpp-python's server on a synthetic model, started (as a user would) with ``--api_key``."""
    from harness.engines.llama_cpp.server import SERVER
    from harness.runconfig import prepare_config, prepare_weights
    from harness.serving.server import ServerProcess, free_port

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCHCAL_CACHE", str(probed_cache))
        cfg = prepare_config(LLAMA)
        weights, _ = prepare_weights(cfg)
        port = free_port()
        log = tmp_path_factory.mktemp("server") / "server.log"
        # the server's readiness probe sends no key: wait on a path the key does not guard
        with ServerProcess(SERVER.command(cfg, weights, port) + ["--api_key", KEY], log, port=port,
                           ready_path="/docs", startup_timeout_s=300) as server:
            yield server, patch


def _external(port: int, **extra) -> dict:
    return {"model": "smollm2-135m", "device": "cpu", "prompt_tokens": [32], "gen_tokens": 8, "context": 512,
            "weights": "external", "engine_options": {},
            "serve": {"concurrency": [1, 2], "requests": 4, "warmup": 1,
                      "external": {"endpoint": f"http://127.0.0.1:{port}/v1", **extra}}}


def test_a_running_server_is_driven_and_recorded_without_its_key(keyed_server, tmp_path, capsys):
    from harness.serving.run import run_external_serving

    server, _patch = keyed_server
    runs = tmp_path / "runs"
    record, path = run_external_serving(_external(server.port, api_key_env="SERVER_KEY"), runs, say=print,
                                        environ={"SERVER_KEY": KEY})
    assert record["status"] == "ok", record["reason"]
    levels = record["measurements"]["serving"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and all(lv["completed"] == 4 for lv in levels)
    assert all(lv["prompt_tokens"] == 4 * 32 for lv in levels)  # prompts sized with the server's tokenizer
    cfg = record["config"]
    assert (cfg["engine"], cfg["serve"]["server"], cfg["quant"], cfg["weights"]) == (
        "llama.cpp", "llama-cpp-python", "Q8_0", "external")  # what the server said it is; the format from its id
    assert cfg["serve"]["external"]["api_key_env"] == "SERVER_KEY" and cfg["engine_options"] == {}
    ext = record["provenance"]["external_server"]
    assert ext["owned_by"] == "me" and ext["endpoint"]["loopback"] and ext["metrics"] is False
    assert record["memory"]["peak_bytes"] is None and "measured no memory" in record["memory"]["not_measured"]
    written = [p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file()]
    out = capsys.readouterr()
    assert written and not any(KEY in text for text in written) and KEY not in out.out + out.err


def test_a_wrong_or_missing_key_is_refused_before_any_load_and_not_echoed(keyed_server, tmp_path):
    from harness.serving.run import run_external_serving

    server, _patch = keyed_server
    wrong = KEY[::-1]
    with pytest.raises(BenchcalError, match="HTTP 401") as caught:
        run_external_serving(_external(server.port, api_key_env="SERVER_KEY"), tmp_path, say=print,
                             environ={"SERVER_KEY": wrong})
    assert wrong not in str(caught.value) and KEY not in str(caught.value)
    with pytest.raises(BenchcalError, match="no API key"):
        run_external_serving(_external(server.port), tmp_path, say=print, environ={})
    assert not list(tmp_path.rglob("*.json"))  # nothing recorded


def test_bench_drives_the_server_from_the_command_line(keyed_server, tmp_path):
    server, _patch = keyed_server
    env = {**os.environ, "SERVER_KEY": KEY, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchcal", "bench", "--serve", "--endpoint",
                           f"http://127.0.0.1:{server.port}/v1", "--api-key-env", "SERVER_KEY", "--model",
                           "smollm2-135m", "--gpu", "cpu", "--prompt", "32", "--gen", "8", "--concurrency", "2",
                           "--requests", "4", "--runs-dir", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "concurrency 2" in done.stdout and KEY not in done.stdout + done.stderr
    (record_path,) = tmp_path.rglob("*.json")
    assert KEY not in record_path.read_text()



@pytest.mark.vllm
def test_a_running_vllm_server_is_named_by_its_version_and_metrics(cache, tmp_path):
    # vLLM's server as a user would have started it (here by the harness, on a synthetic model without a
    # tokenizer), then driven from outside: /version and /metrics are its own
    pytest.importorskip("vllm")
    from harness.engines.vllm.server import VllmServer
    from harness.runconfig import prepare_config, prepare_weights
    from harness.serving.run import run_external_serving
    from harness.serving.server import ServerProcess, free_port

    shrink = {"num_layers": 2, "vocab_size": 4096}
    cfg = prepare_config({"model": "qwen2.5-0.5b", "engine": "vllm", "device": "cpu", "context": 512,
                          "prompt_tokens": [32], "gen_tokens": 8, "arch_overrides": shrink,
                          "engine_options": {"threads": 2}, "serve": {"concurrency": [1, 2]}})
    weights, _ = prepare_weights(cfg)
    server, port = VllmServer(), free_port()
    with ServerProcess(server.command(cfg, weights, port), tmp_path / "server.log", port=port,
                       env=server.environment(cfg, os.environ), startup_timeout_s=600):
        external = {**_external(port), "model": "qwen2.5-0.5b", "quant": "BF16", "arch_overrides": shrink}
        record, _path = run_external_serving(external, tmp_path / "runs", say=print, environ={})
    assert record["status"] == "ok", record["reason"]
    assert (record["config"]["engine"], record["config"]["serve"]["server"]) == ("vllm", "vllm")
    ext = record["provenance"]["external_server"]
    assert ext["owned_by"] == "vllm" and ext["metrics"] is True and "random token ids" in ext["prompts"]
    assert record["provenance"]["engine_version"] == ext["version"]["version"]
    for level in record["measurements"]["serving"]["levels"]:
        assert level["completed"] == 4 and level["server_metrics"]["generation_tokens"] == 4 * 8
