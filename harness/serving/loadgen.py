"""An asynchronous load generator for OpenAI-compatible completion servers, engine-free.

One *level* is a bounded batch of streaming ``/v1/completions`` requests sent either by ``concurrency`` workers
(each sends its next request when its last one ends) or as Poisson arrivals at ``request_rate`` requests per
second. Every streamed event is timestamped on ``time.perf_counter()``'s clock with the time its bytes reached the
host (:mod:`harness.serving.httpstream`). Per request: TTFT (send to
first token), the inter-token latencies (ITL), TPOT ((last token - first token) / (tokens - 1)) and the end-to-end
latency (E2EL, send to the end of the stream); per level: request throughput, output and total tokens/s over the
level's wall time (first send to last end), and every figure's mean / p50 / p90 / p99 with its samples.

What goes into a request (token ids or a text sized to a token count, the engine's options that make it generate
exactly the tokens asked for) is the caller's: ``payload(i)`` builds request ``i``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.records import percentile, summarize
from harness.serving.httpstream import post_stream, sse_lines


@dataclass
class RequestResult:
    """What one request did. Times are ``perf_counter`` seconds; ``token_times_s`` one per generated token."""

    started_s: float
    ended_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    timed_out: bool = False
    events: list[tuple[float, dict[str, Any]]] | None = None  # every choice event with its arrival (keep_events)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and bool(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.started_s if self.token_times_s else None

    @property
    def itl_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def tpot_s(self) -> float | None:
        times = self.token_times_s
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    @property
    def e2el_s(self) -> float | None:
        return self.ended_s - self.started_s if self.ended_s is not None else None


def _token_times(events: list[tuple[float, dict[str, Any]]], usage: Mapping[str, Any] | None) -> list[float]:
    """Arrival times of the generated tokens among a stream's choice events.

    Servers send one event per token. vLLM sends the last token with its ``finish_reason`` (and a usage event
    after it); llama-cpp-python's server sends an empty event carrying only the ``finish_reason`` after the last
    token. With a usage count the first ``completion_tokens`` events are the tokens; without one, a trailing
    event with a finish reason and no text is not a token.
    """
    times = [t for t, _ in events]
    count = (usage or {}).get("completion_tokens")
    if isinstance(count, int) and 0 <= count <= len(times):
        return times[:count]
    if events:
        last = (events[-1][1].get("choices") or [{}])[0]
        if last.get("finish_reason") is not None and not last.get("text") and not last.get("token_ids"):
            return times[:-1]
    return times


async def stream_request(url: str, payload: Mapping[str, Any], timeout_s: float,
                         keep_events: bool = False, headers: Mapping[str, str] | None = None) -> RequestResult:
    """POST one streaming completion and time its events by their bytes' arrival (:mod:`harness.serving.httpstream`:
    the kernel's receive time of each read); never raises for the server's failures. ``keep_events``: keep every
    event with its arrival time in ``result.events``; ``headers``: sent with the request (an API key's)."""
    result = RequestResult(started_s=time.perf_counter())
    events: list[tuple[float, dict[str, Any]]] = []
    usage: dict[str, Any] | None = None
    try:
        status, _headers, pieces = await asyncio.wait_for(post_stream(url, payload, headers), timeout_s)
        if status != 200:
            body = b"".join(data for _, data in pieces)[:200].decode("utf-8", "replace").replace("\n", " ")
            result.error = f"HTTP {status}: {body}"
        else:
            for arrival, line in sse_lines(pieces):
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"]
                if event.get("choices"):
                    events.append((arrival, event))
        result.ended_s = pieces[-1][0] if pieces else time.perf_counter()  # the stream's last bytes
    except asyncio.TimeoutError:
        result.timed_out = True
    except (OSError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    if result.ended_s is None:
        result.ended_s = time.perf_counter()
    result.token_times_s = _token_times(events, usage)
    if keep_events:
        result.events = events
    result.output_tokens = len(result.token_times_s)
    if usage and isinstance(usage.get("prompt_tokens"), int):
        result.prompt_tokens = usage["prompt_tokens"]
    return result


async def run_level(
    url: str,
    payload: Callable[[int], Mapping[str, Any]],
    *,
    requests: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
    duration_s: float = 600.0,
    timeout_s: float = 300.0,
    seed: int = 0,
    keep_events: bool = False,
    prompt_tokens: Callable[[int], int] | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` requests at a fixed ``concurrency`` or Poisson ``request_rate`` (exactly one of the two);
    no request starts after ``duration_s``. Returns every request's result and the level's wall time.
    ``prompt_tokens(i)``: request ``i``'s prompt length, where the server's stream does not count it; ``headers``:
    sent with every request."""
    if (concurrency is None) == (request_rate is None):
        raise ValueError("a level has either a concurrency or a request rate")
    results: list[RequestResult] = []
    start = time.perf_counter()
    stop_at = start + duration_s

    async def send(i: int) -> None:
        result = await stream_request(url, payload(i), timeout_s, keep_events, headers)
        if result.prompt_tokens is None and prompt_tokens is not None:
            result.prompt_tokens = prompt_tokens(i)
        results.append(result)
    if concurrency is not None:
        counter = iter(range(requests))

        async def worker() -> None:
            for i in counter:
                if time.perf_counter() > stop_at:
                    return
                await send(i)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, requests)))))
    else:
        async def send_at(offset: float, i: int) -> None:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() <= stop_at:
                await send(i)

        from predictor.load import poisson_offsets  # the draw the serving model simulates

        offsets = poisson_offsets(float(request_rate), requests, seed)
        await asyncio.gather(*(send_at(offset, i) for i, offset in enumerate(offsets)))
    if not results:
        return results, 0.0
    first = min(r.started_s for r in results)
    last = max(r.ended_s or r.started_s for r in results)
    return results, last - first


def distribution(samples_s: list[float]) -> dict[str, Any]:
    """Summary of latencies given in seconds, in milliseconds: every sample, median, mean, stddev, p10, p50, p90,
    p99, n (:func:`harness.records.summarize` plus p50 and p99)."""
    values = sorted(1000.0 * s for s in samples_s if s is not None and math.isfinite(s))
    out = summarize(values)
    out["p50"] = out["median"]
    out["p99"] = percentile(values, 99.0)
    return out


def level_summary(results: list[RequestResult], wall_s: float, prompt_tokens: int) -> dict[str, Any]:
    """The figures of one level (see the module docstring); latencies in ms, throughputs per second of wall time."""
    done = [r for r in results if r.ok]
    output = sum(r.output_tokens or 0 for r in done)
    prompts = sum(r.prompt_tokens if r.prompt_tokens is not None else prompt_tokens for r in done)
    per_s = (lambda x: x / wall_s) if wall_s > 0 else (lambda x: None)
    errors = [r.error for r in results if r.error]
    return {
        "requests": len(results),
        "completed": len(done),
        "errors": len(errors),
        "timeouts": sum(r.timed_out for r in results),
        "error_messages": sorted(set(errors))[:5],
        "duration_s": wall_s,
        "request_throughput": per_s(len(done)),
        "output_tok_s": per_s(output),
        "total_tok_s": per_s(output + prompts),
        "output_tokens": output,
        "prompt_tokens": prompts,
        "ttft_ms": distribution([r.ttft_s for r in done]),
        "tpot_ms": distribution([r.tpot_s for r in done if r.tpot_s is not None]),
        "itl_ms": distribution([gap for r in done for gap in r.itl_s]),
        "e2el_ms": distribution([r.e2el_s for r in done]),
    }
