"""Serving under load: throughput and latency of a server with ``concurrency`` requests in flight (a closed loop:
each client sends its next request when its last one ends), each a ``prompt_tokens``-token prompt generating
``output_tokens`` tokens.

The engine's step times come from the analytical model (:func:`predictor.estimate.predict_scenario`): the prefill
of one prompt, ``prefill_s``, and one decode step of a batch of B sequences, ``step(B)`` (weights read once, the KV
of all B, compute once the batch is large). What the server adds is calibrated from serving runs
(:mod:`calibration.serving`; neutral where none was measured): ``prefill_scale`` (k, on the prefill: the server's
prompt path against the harness's), ``decode_scale`` (d, on each decode step: the server's step against the
harness's; a server that runs one request at a time keeps 1, its step overhead says the same),
``step_overhead_ms`` per decode step (scheduling, streaming), ``seq_overhead_ms`` per sequence per step (sampling,
detokenizing, one event per sequence) and ``request_overhead_ms`` per request (HTTP, tokenizing, bookkeeping).

- **One request at a time** (llama-cpp-python's server: one ``Llama``, requests served in turn). The engine's
  service time for a request is ``S = k prefill_s + (n - 1) (step(1) + o_step)``; the request's own overhead
  ``o_req`` (HTTP, tokenizing, the client) runs outside it. Alone (c = 1) a request takes ``S + o_req``; in a
  closed loop of c clients the overheads overlap the others' service and each request waits for the c - 1 ahead
  of it: end-to-end ``max(c S, S + o_req)``, TTFT that minus (n - 1) TPOT, TPOT ``step(1) + o_step``, ``c /
  end-to-end`` requests per second (``seq_overhead_ms`` is ``o_step`` here: one sequence per step).
- **Continuous batching** (vLLM; llama.cpp's ``llama-server``, whose slots decode together). With equal requests in
  a closed loop the c requests move in step: they arrive together and their prompts are prefilled in two steps (an
  idle engine starts a step on the first request to reach it; the others, arriving while it runs, wait for it and
  are prefilled together in the next: what vLLM's request timelines show, docs/model.md), then B = min(c,
  max_num_seqs) sequences decode together: TTFT, the others' (the p50 from 2 in flight), ``c k prefill_s + 2 o_step
  + o_req`` (alone, ``k prefill_s + o_step + o_req``), TPOT ``d step(B) + o_step + B o_seq``, end-to-end TTFT + (n -
  1) TPOT, and ``c / end-to-end`` requests per second (Little's law). With more requests in flight than the server
  runs (c > B) they go in waves of B, each ``W = B k prefill_s + 2 o_step + o_req + (n - 1) TPOT`` long, and a
  request waits its turn: end-to-end ``c / B x W``, TTFT that minus (n - 1) TPOT.

In a closed loop with fixed lengths every request sees the same, so each figure's p50 is its mean; the spread a
real server shows (measured p90/p99) is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from predictor.engines import traits
from predictor.estimate import predict_scenario
from predictor.memory import VLLM_MAX_NUM_SEQS, vllm_batch_defaults
from predictor.scenario import Scenario, scenario_device

MODES = ("serial", "continuous")


def serving_figures(mode: str, concurrency: int, output_tokens: int, prefill_s: float, step1_s: float,
                    step_s: float, prefill_scale: float = 1.0, step_overhead_ms: float = 0.0,
                    seq_overhead_ms: float = 0.0, request_overhead_ms: float = 0.0,
                    max_num_seqs: int | None = None, decode_scale: float = 1.0) -> dict[str, float]:
    """The formulas of the module docstring: request throughput (1/s), output tokens/s, TTFT, TPOT and end-to-end
    latency (ms). ``step1_s``: one decode step of one sequence; ``step_s``: of the running batch (both before
    ``decode_scale``)."""
    c, n = max(int(concurrency), 1), max(int(output_tokens), 1)
    o_step, o_seq, o_req = step_overhead_ms / 1000.0, seq_overhead_ms / 1000.0, request_overhead_ms / 1000.0
    prefill = prefill_scale * prefill_s
    step1_s, step_s = decode_scale * step1_s, decode_scale * step_s
    if mode == "serial":
        tpot = step1_s + o_step
        service = prefill + (n - 1) * tpot
        # the request's own overhead runs outside the engine: alone it adds to each request; with others
        # waiting it overlaps their service, and the engine, never idle, sets the pace
        e2e = max(c * service, service + o_req)
        ttft = e2e - (n - 1) * tpot
    elif mode == "continuous":
        batch = min(c, int(max_num_seqs or c))
        tpot = step_s + o_step + batch * o_seq
        # the prompts take two steps from 2 in flight: an idle engine prefills the first alone, the others next
        steps = 2 if batch >= 2 else 1
        if c <= batch:
            ttft = c * prefill + steps * o_step + o_req
            e2e = ttft + (n - 1) * tpot
        else:  # waves of `batch`, the others waiting their turn: each request waits for c / batch waves
            wave = batch * prefill + steps * o_step + o_req + (n - 1) * tpot
            e2e = c / batch * wave
            ttft = e2e - (n - 1) * tpot
    else:
        raise ValueError(f"unknown serving mode {mode!r} (choose from: {', '.join(MODES)})")
    rate = c / e2e if e2e > 0 else math.inf  # 0 only with every term at 0 (the fit's columns)
    return {"request_throughput": rate, "output_tok_s": rate * n, "ttft_ms": 1000.0 * ttft,
            "tpot_ms": 1000.0 * tpot, "e2el_ms": 1000.0 * e2e}


OVERHEADS = {"prefill_scale": 1.0, "decode_scale": 1.0, "step_overhead_ms": 0.0, "seq_overhead_ms": 0.0,
             "request_overhead_ms": 0.0}


def server_terms(overheads: Mapping[str, Any] | None) -> tuple[dict[str, float], str]:
    """A serving fit's terms (:data:`OVERHEADS`' keys, the neutral values where it has none) and their source."""
    fit = {**OVERHEADS, **{k: float(v) for k, v in (overheads or {}).items() if k in OVERHEADS and v is not None}}
    return fit, str((overheads or {}).get("source")
                    or "uncalibrated: no serving run fitted (prefill_scale and decode_scale 1, overheads 0)")


def step_times(scenario: Scenario, concurrency: int, output_tokens: int, coefficients: Any = "default",
               max_num_seqs: int | None = None) -> dict[str, float]:
    """``prefill_s``, ``step1_s`` and ``step_s`` (the running batch's step) for ``scenario``'s prompt, decoding
    halfway through the output, from the analytical model."""
    prompt = int(scenario.prompt_tokens)
    middle = prompt + max(int(output_tokens), 1) // 2
    batch = min(max(int(concurrency), 1), int(max_num_seqs or concurrency))
    one = predict_scenario(scenario.replace(batch=1), coefficients, launch=False).values
    decode1 = predict_scenario(scenario.replace(batch=1, prompt_tokens=middle), coefficients, launch=False).values
    decode = decode1 if batch == 1 else predict_scenario(batch_step(scenario, batch, middle, output_tokens),
                                                         coefficients, launch=False).values
    return {"prefill_s": float(one["prefill_s"]), "step1_s": float(decode1["decode_step_s"]),
            "step_s": float(decode["decode_step_s"])}


def batch_step(scenario: Scenario, batch: int, tokens: int, output_tokens: int) -> Scenario:
    """The scenario of one decode step of ``batch`` sequences with ``tokens`` in the cache each. A batching server
    keeps only the tokens each sequence has (vLLM's paged pool), so beyond one sequence the context is the
    sequences' own length (prompt + output), not the server's maximum: ``batch`` x the maximum would size a cache no
    batching server holds (and wrongly offload it)."""
    if batch <= 1:
        return scenario.replace(batch=1, prompt_tokens=tokens)
    own = int(scenario.prompt_tokens) + max(int(output_tokens), 1)
    return scenario.replace(batch=batch, prompt_tokens=tokens, context=min(int(scenario.context), own))


BATCHING_SERVERS = ("llama-server",)  # servers that batch although their engine's default one does not


def serving_mode(engine: str, server: str | None = None) -> str:
    """``continuous`` for a server that batches the requests in flight (vLLM's; llama.cpp's ``llama-server``, whose
    slots decode together), ``serial`` for one that runs them one at a time (llama-cpp-python's, llama.cpp's
    default here)."""
    return "continuous" if traits(engine).server_batches or server in BATCHING_SERVERS else "serial"


SERVERS = {"llama.cpp": ("llama-cpp-python", "llama-server"), "vllm": ("vllm",)}  # what serves each engine
SERVER_NAMES = tuple(sorted({name for names in SERVERS.values() for name in names}))


def check_server(engine: str, server: str | None) -> None:
    """BenchcalError unless ``server`` (None: the engine's default) serves ``engine``."""
    from predictor.errors import BenchcalError

    if server is not None and server not in SERVERS.get(str(engine), ()):
        raise BenchcalError(f"--server {server} does not serve {engine} (choose from: "
                            f"{', '.join(SERVERS.get(str(engine), ())) or 'none'})")


def serving_key(engine: str, server: str | None = None) -> str:
    """The name a serving fit is kept under in the coefficient table: the engine for its default server, the server
    for another that serves it differently (``llama-server``)."""
    return str(server) if server in BATCHING_SERVERS and not traits(engine).server_batches else str(engine)


def predict_load(scenario: Scenario, concurrency: int, output_tokens: int, *, coefficients: Any = "default",
                 overheads: Mapping[str, Any] | None = None, max_num_seqs: int | None = None) -> dict[str, Any]:
    """The module's figures for ``scenario`` at ``concurrency`` requests in flight, with a serving fit's values
    (``overheads``: the keys of :data:`OVERHEADS` and ``source``) or the neutral ones (uncalibrated)."""
    fit, source = server_terms(overheads)
    max_num_seqs = max_num_seqs or scenario.max_num_seqs or (LLAMA_SERVER_SLOTS if scenario.server == "llama-server"
                                                              else None)
    times = step_times(scenario, concurrency, output_tokens, coefficients, max_num_seqs)
    mode = serving_mode(str(scenario.engine), scenario.server)
    figures = serving_figures(mode, concurrency, output_tokens, times["prefill_s"], times["step1_s"], times["step_s"],
                              max_num_seqs=max_num_seqs, **fit)
    return {"mode": mode, "server": scenario.server, "concurrency": int(concurrency),
            "prompt_tokens": int(scenario.prompt_tokens),
            "output_tokens": int(output_tokens), **{k: round(v, 4) for k, v in figures.items()},
            "step_times_ms": {k.removesuffix("_s") + "_ms": round(1000.0 * v, 4) for k, v in times.items()},
            "overheads": {**fit, "source": source}}


# ---------------------------------------------------------------------------------------------------------------
# Open loop: Poisson arrivals at a request rate
# ---------------------------------------------------------------------------------------------------------------

RATE_REQUESTS = 1000  # requests simulated for a steady-state figure ...
RATE_WARMUP = 100  # ... of which the first, arriving at an empty server, are left out of the figures
DEFAULT_MAX_NUM_SEQS = VLLM_MAX_NUM_SEQS  # vLLM's default batch size limit (max_num_seqs)


def poisson_offsets(rate: float, n: int, seed: int = 0) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` Poisson arrivals at ``rate`` per second: the first at 0, then
    exponential gaps drawn from ``random.Random(seed)`` (the same sequence the harness's load generator sends)."""
    import random

    rng, out, t = random.Random(seed), [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def simulate_serial(arrivals, service_s: float, prefill_s: float, request_overhead_s: float = 0.0):
    """One request at a time, first come first served: per request (TTFT, end-to-end) seconds. A request starts when
    it has arrived and the one before it has ended; its own overhead runs outside the engine (as in the closed
    loop's formula)."""
    ttft, e2e, free = [], [], 0.0
    for a in arrivals:
        start = max(a, free)
        free = start + service_s
        ttft.append(start - a + prefill_s + request_overhead_s)
        e2e.append(free - a + request_overhead_s)
    return ttft, e2e


def simulate_continuous(arrivals, output_tokens: int, prefill_s: float, step_s, *, step_overhead_s: float = 0.0,
                        seq_overhead_s: float = 0.0, request_overhead_s: float = 0.0, max_num_seqs: int | None = None,
                        prompt_tokens: int = 0, max_num_batched_tokens: int | None = None):
    """Continuous batching, step by step: each step prefills the prompts admitted at its start (all that have
    arrived, up to ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens, at least one) and decodes one
    token of every running sequence; it takes ``prompts x prefill_s + step_s(B) + B seq_overhead_s +
    step_overhead_s``. A prompt's first token comes out with its prefill step, then one token per step. Per request
    (TTFT, end-to-end) seconds. Requests arriving at the same instant are admitted together: c of them get the
    closed loop's figures less one step overhead (its formulas take the first of them alone, as vLLM's server does).
    Poisson arrivals never come at the same instant."""
    from collections import deque

    n, limit = max(int(output_tokens), 1), int(max_num_seqs or DEFAULT_MAX_NUM_SEQS)
    budget = float(max_num_batched_tokens) if max_num_batched_tokens else float("inf")
    count = len(arrivals)
    first, done = [0.0] * count, [0.0] * count
    waiting: deque[int] = deque()
    running: list[list[int]] = []  # [request, tokens still to decode]
    t, nxt, finished = 0.0, 0, 0
    while finished < count:
        if not running and not waiting:
            t = max(t, arrivals[nxt])
        while nxt < count and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        new, used = [], len(running)
        while waiting and len(running) + len(new) < limit and (not new or used + prompt_tokens <= budget):
            new.append(waiting.popleft())
            used += prompt_tokens
        b = len(running)
        dt = (step_s(b) + b * seq_overhead_s if b else 0.0) + step_overhead_s
        steps = 1
        if not new:  # nothing to admit: run the steps up to the next finish or the next arrival at once
            steps = min(item[1] for item in running)
            if nxt < count and len(running) < limit:
                steps = max(1, min(steps, math.ceil((arrivals[nxt] - t) / dt)))
        t += len(new) * prefill_s + steps * dt
        for item in running:
            item[1] -= steps
            if item[1] == 0:
                done[item[0]] = t
                finished += 1
        running = [item for item in running if item[1] > 0]
        for i in new:
            first[i] = t
            if n == 1:
                done[i] = t
                finished += 1
            else:
                running.append([i, n - 1])
    ttft = [f - a + request_overhead_s for f, a in zip(first, arrivals)]
    e2e = [d - a + request_overhead_s for d, a in zip(done, arrivals)]
    return ttft, e2e


def _distribution_ms(values) -> dict[str, float]:
    import numpy as np

    v = 1000.0 * np.asarray(values, float)
    return {"mean": round(float(v.mean()), 3), "p50": round(float(np.percentile(v, 50)), 3),
            "p90": round(float(np.percentile(v, 90)), 3), "p99": round(float(np.percentile(v, 99)), 3)}


def rate_figures(mode: str, request_rate: float, output_tokens: int, prefill_s: float, step_s, *,
                 prefill_scale: float = 1.0, step_overhead_ms: float = 0.0, seq_overhead_ms: float = 0.0,
                 request_overhead_ms: float = 0.0, max_num_seqs: int | None = None, prompt_tokens: int = 0,
                 max_num_batched_tokens: int | None = None, requests: int = RATE_REQUESTS,
                 warmup: int = RATE_WARMUP, seed: int = 0, steady_state: bool = True,
                 decode_scale: float = 1.0) -> dict[str, Any]:
    """Throughput and TTFT / TPOT / end-to-end distributions (mean, p50, p90, p99, ms) of Poisson arrivals at
    ``request_rate``, simulated over ``requests`` requests (the first ``warmup`` left out). ``step_s(B)``: one decode
    step of B sequences, seconds (before ``decode_scale``). ``capacity`` is the most requests per second the server
    completes (saturated: ``max_num_seqs`` in flight, or one at a time); at or above it queues grow without bound,
    and the figures are None with ``saturated`` true, unless ``steady_state`` is False: then the ``requests``
    arrivals are simulated all the same (a finite measured level, whose queue grows only so far)."""
    n = max(int(output_tokens), 1)
    o_step, o_seq, o_req = step_overhead_ms / 1000.0, seq_overhead_ms / 1000.0, request_overhead_ms / 1000.0
    prefill = prefill_scale * prefill_s
    unscaled = step_s

    def step_s(batch: int) -> float:
        return decode_scale * unscaled(batch)

    limit = int(max_num_seqs or DEFAULT_MAX_NUM_SEQS)
    if mode == "serial":
        tpot = step_s(1) + o_step
        service = prefill + (n - 1) * tpot
        capacity = 1.0 / service
    elif mode == "continuous":
        capacity = serving_figures("continuous", limit, n, prefill_s, step_s(1), step_s(limit), prefill_scale,
                                   step_overhead_ms, seq_overhead_ms, request_overhead_ms, limit)["request_throughput"]
    else:
        raise ValueError(f"unknown serving mode {mode!r} (choose from: {', '.join(MODES)})")
    out: dict[str, Any] = {"request_rate": float(request_rate), "capacity_requests_per_s": round(capacity, 4),
                           "utilization": round(request_rate / capacity, 4), "requests_simulated": int(requests),
                           "warmup": int(warmup), "seed": int(seed)}
    if request_rate >= capacity and steady_state:
        return {**out, "saturated": True, "request_throughput": round(capacity, 4),
                "output_tok_s": round(capacity * n, 4), "ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
    arrivals = poisson_offsets(request_rate, int(requests), seed)
    if mode == "serial":
        ttft, e2e = simulate_serial(arrivals, service, prefill, o_req)
    else:
        ttft, e2e = simulate_continuous(arrivals, n, prefill, step_s, step_overhead_s=o_step, seq_overhead_s=o_seq,
                                        request_overhead_s=o_req, max_num_seqs=limit, prompt_tokens=prompt_tokens,
                                        max_num_batched_tokens=max_num_batched_tokens)
    keep = slice(min(int(warmup), len(arrivals) - 1), None)
    ttft, e2e, sent = ttft[keep], e2e[keep], arrivals[keep]
    tpot = [(e - f) / (n - 1) for e, f in zip(e2e, ttft)] if n > 1 else [0.0] * len(e2e)
    span = max(a + e for a, e in zip(sent, e2e)) - sent[0]
    rate = len(sent) / span if span > 0 else float("nan")
    return {**out, "saturated": bool(request_rate >= capacity), "request_throughput": round(rate, 4),
            "output_tok_s": round(rate * n, 4), "ttft_ms": _distribution_ms(ttft), "tpot_ms": _distribution_ms(tpot),
            "e2el_ms": _distribution_ms(e2e)}


def step_curve(scenario: Scenario, output_tokens: int, largest: int, coefficients: Any = "default"):
    """``(prefill_s, step_s)``: the prompt's prefill and a function B -> one decode step of B sequences (halfway
    through the output), from the analytical model at B = 1, 2, 4, ... ``largest``, linear in between."""
    import numpy as np

    middle = int(scenario.prompt_tokens) + max(int(output_tokens), 1) // 2
    sizes = sorted({1, max(int(largest), 1)} | {2 ** k for k in range(1, 16) if 2 ** k < largest})
    steps = [float(predict_scenario(batch_step(scenario, b, middle, output_tokens), coefficients,
                                    launch=False).values["decode_step_s"]) for b in sizes]
    prefill = float(predict_scenario(scenario.replace(batch=1), coefficients, launch=False).values["prefill_s"])
    return prefill, (lambda b: float(np.interp(b, sizes, steps)))


def predict_rate(scenario: Scenario, request_rate: float, output_tokens: int, *, coefficients: Any = "default",
                 overheads: Mapping[str, Any] | None = None, max_num_seqs: int | None = None,
                 requests: int = RATE_REQUESTS, warmup: int = RATE_WARMUP, seed: int = 0) -> dict[str, Any]:
    """:func:`rate_figures` for ``scenario`` with the analytical model's step times and a serving fit's terms
    (``overheads``, as for :func:`predict_load`)."""
    fit, source = server_terms(overheads)
    mode = serving_mode(str(scenario.engine), scenario.server)
    limit = running_limit(scenario, output_tokens, coefficients, max_num_seqs) if mode == "continuous" else 1
    prefill, step = step_curve(scenario, output_tokens, limit, coefficients)
    figures = rate_figures(mode, float(request_rate), output_tokens, prefill, step, max_num_seqs=limit,
                           prompt_tokens=int(scenario.prompt_tokens),
                           max_num_batched_tokens=scenario.max_num_batched_tokens or _batch_defaults(scenario)[0],
                           requests=requests, warmup=warmup, seed=seed, **fit)
    return {"mode": mode, "server": scenario.server, "prompt_tokens": int(scenario.prompt_tokens),
            "output_tokens": int(output_tokens), **figures, "overheads": {**fit, "source": source}}


# llama-server's defaults: ``--parallel`` auto is 4 slots in a unified cache (tools/server/server.cpp), and one
# decode call takes up to ``--batch-size`` 2,048 tokens (common/common.h, n_batch)
LLAMA_SERVER_SLOTS = 4
LLAMA_SERVER_BATCH_TOKENS = 2048


def _batch_defaults(scenario: Scenario) -> tuple[int, int]:
    """The server's ``(tokens one step takes, sequences it runs at once)`` when the scenario gives neither: vLLM's
    ``(max_num_batched_tokens, max_num_seqs)`` on the scenario's device, llama-server's batch size and slots."""
    if scenario.server == "llama-server":
        return LLAMA_SERVER_BATCH_TOKENS, LLAMA_SERVER_SLOTS
    return vllm_batch_defaults(scenario_device(scenario))


def running_limit(scenario: Scenario, output_tokens: int, coefficients: Any = "default",
                  max_num_seqs: int | None = None) -> int:
    """The most sequences a batching server runs at once: ``max_num_seqs`` (vLLM's default on the device, 256 or
    1,024, :func:`predictor.memory.vllm_batch_defaults`; llama-server's 4 slots), and no more than its KV pool
    holds at their full length (prompt + output)."""
    limit = int(max_num_seqs or scenario.max_num_seqs or _batch_defaults(scenario)[1])
    pool = (predict_scenario(scenario.replace(batch=1), coefficients, launch=False).serving or {}).get("kv_pool_tokens")
    if pool:
        limit = max(1, min(limit, int(pool) // (int(scenario.prompt_tokens) + max(int(output_tokens), 1))))
    return limit


def max_concurrency(scenario: Scenario, output_tokens: int, *, max_ttft_ms: float | None = None,
                    max_tpot_ms: float | None = None, coefficients: Any = "default",
                    overheads: Mapping[str, Any] | None = None, max_num_seqs: int | None = None,
                    largest: int = 4096) -> dict[str, Any] | None:
    """The most requests in flight (closed loop, :func:`serving_figures`) whose TTFT is at most ``max_ttft_ms`` and
    TPOT at most ``max_tpot_ms``, with its figures; None when one request alone misses the target. A batching server
    is searched up to its running limit (:func:`running_limit`); one that serves a request at a time up to
    ``largest`` (the others wait: its throughput is the same at any load), and with no TTFT target it is given one
    (nothing else bounds the wait). Both figures grow with the requests in flight, so the search is a bisection."""
    fit, source = server_terms(overheads)
    mode = serving_mode(str(scenario.engine), scenario.server)
    if mode == "continuous":
        top, cap = running_limit(scenario, output_tokens, coefficients, max_num_seqs), "running limit"
    elif max_ttft_ms is None:  # more in flight only queue: TPOT is the same, and nothing bounds the wait
        top, cap = 1, "one request at a time"
    else:
        top, cap = largest, "search limit"
    prefill, step = step_curve(scenario, output_tokens, top if mode == "continuous" else 1, coefficients)

    def at(c: int) -> dict[str, float]:
        return serving_figures(mode, c, output_tokens, prefill, step(1), step(min(c, top)), max_num_seqs=top,
                               **fit)

    def ok(figures: Mapping[str, float]) -> bool:
        return ((max_ttft_ms is None or figures["ttft_ms"] <= max_ttft_ms)
                and (max_tpot_ms is None or figures["tpot_ms"] <= max_tpot_ms))

    if not ok(at(1)):
        return None
    lo, hi = 1, top
    if ok(at(hi)):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(at(mid)) else (lo, mid)
    figures = at(lo)
    return {"mode": mode, "concurrency": lo, "limit": top, "limited_by": "target" if lo < top else cap,
            **{k: round(v, 4) for k, v in figures.items()},
            "overheads": {**fit, "source": source}}
