"""The load generator's accounting, against a stub streaming server on loopback whose timing the test sets, and
against the event streams real servers sent (captured under tests/data/serving/)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from aiohttp import web

from harness.serving.loadgen import (
    _token_times,
    distribution,
    level_summary,
    run_level,
)
from predictor.load import poisson_offsets

DATA = Path(__file__).parent / "data" / "serving"


def _events(name: str) -> list[tuple[float, dict]]:
    lines = [line[5:].strip() for line in (DATA / name).read_text().splitlines() if line.startswith("data:")]
    return [(float(i), json.loads(line)) for i, line in enumerate(lines) if line != "[DONE]"]


def test_tokens_are_counted_as_each_real_server_streams_them():
    # llama-cpp-python's server: 4 token events, then an empty event carrying the finish reason
    llama = _events("llama_cpp_server_stream.sse")
    assert len(llama) == 5 and _token_times(llama, None) == [0.0, 1.0, 2.0, 3.0]
    # vLLM: the last token comes with the finish reason, then a usage event (no choices)
    vllm = _events("vllm_server_stream.sse")
    usage = next(e["usage"] for _, e in vllm if e.get("usage"))
    choices = [(t, e) for t, e in vllm if e.get("choices")]
    assert usage["completion_tokens"] == 5 and len(_token_times(choices, usage)) == 5
    # llama-server: 4 token events, then an empty one with the finish reason and the usage
    server = _events("llama_server_stream.sse")
    usage = server[-1][1]["usage"]
    assert len(server) == 5 and usage["completion_tokens"] == 4 and _token_times(server, usage) == [0.0, 1.0, 2.0, 3.0]
    assert _token_times(server, None) == [0.0, 1.0, 2.0, 3.0]


class Stub:
    """A streaming completions server: ``delay_s`` before the first event, ``gap_s`` between events."""

    def __init__(self, tokens: int = 4, delay_s: float = 0.02, gap_s: float = 0.01, status: int = 200) -> None:
        self.tokens, self.delay_s, self.gap_s, self.status = tokens, delay_s, gap_s, status
        self.in_flight = self.peak = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.status != 200:
            return web.Response(status=self.status, text="stub failure")
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        response = web.StreamResponse()
        await response.prepare(request)
        await asyncio.sleep(self.delay_s)
        for i in range(int(body["max_tokens"])):
            if i:
                await asyncio.sleep(self.gap_s)
            await response.write(b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n')
        await response.write(b'data: {"choices": [{"text": "", "finish_reason": "length"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        self.in_flight -= 1
        return response

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> Stub:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/completions"


def test_a_concurrency_level_keeps_that_many_requests_in_flight_and_times_every_token():
    with Stub(delay_s=0.05, gap_s=0.02) as stub:
        results, wall = asyncio.run(run_level(stub.url, lambda i: {"max_tokens": 4}, requests=8, concurrency=2))
    assert stub.peak == 2 and len(results) == 8 and all(r.ok for r in results)
    summary = level_summary(results, wall, prompt_tokens=10)
    assert summary["completed"] == 8 and summary["output_tokens"] == 32 and summary["errors"] == 0
    assert 45 <= summary["ttft_ms"]["p50"] <= 150 and 15 <= summary["tpot_ms"]["p50"] <= 60
    assert len(summary["itl_ms"]["samples"]) == 8 * 3
    # 4 rounds of 2 requests, each about 0.05 + 3 x 0.02 s: about 0.44 s of wall time
    assert 0.35 <= wall <= 1.5 and summary["output_tok_s"] == pytest.approx(32 / wall)


def test_a_request_rate_level_sends_poisson_arrivals():
    offsets = poisson_offsets(20.0, 2000, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 20.0, rel=0.1)
    with Stub(delay_s=0.0, gap_s=0.0) as stub:
        results, _ = asyncio.run(run_level(stub.url, lambda i: {"max_tokens": 2}, requests=6, request_rate=50.0))
    assert len(results) == 6 and all(r.output_tokens == 2 for r in results)


def test_failures_and_timeouts_are_counted_not_raised():
    with Stub(status=500) as stub:
        results, wall = asyncio.run(run_level(stub.url, lambda i: {"max_tokens": 2}, requests=3, concurrency=1))
    summary = level_summary(results, wall, 4)
    assert summary["completed"] == 0 and summary["errors"] == 3 and "HTTP 500" in summary["error_messages"][0]
    with Stub(delay_s=2.0) as stub:
        results, wall = asyncio.run(run_level(stub.url, lambda i: {"max_tokens": 2}, requests=2, concurrency=2,
                                              timeout_s=0.2))
    assert level_summary(results, wall, 4)["timeouts"] == 2
    with pytest.raises(ValueError):
        asyncio.run(run_level("http://127.0.0.1:9/", lambda i: {}, requests=1))


def test_distributions_are_in_milliseconds_with_p50_and_p99():
    d = distribution([0.001 * i for i in range(1, 101)])
    assert d["n"] == 100 and d["p50"] == pytest.approx(50.5) and d["p99"] == pytest.approx(99.01)
    assert distribution([])["p99"] is None
