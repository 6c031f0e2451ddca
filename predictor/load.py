"""Serving under load: throughput and latency of a server with ``concurrency`` requests in flight (a closed loop:
each client sends its next request when its last one ends), each a ``prompt_tokens``-token prompt generating
``output_tokens`` tokens.

The engine's step times come from the analytical model (:func:`predictor.estimate.predict_scenario`): the prefill
of one prompt, ``prefill_s``, and one decode step of a batch of B sequences, ``step(B)`` (weights read once, the KV
of all B, compute once the batch is large). What the server adds is calibrated from serving runs
(:mod:`calibration.serving`; neutral where none was measured): ``prefill_scale`` (k, on the prefill: the server's
prompt path against the harness's), ``step_overhead_ms`` per decode step (scheduling, streaming),
``seq_overhead_ms`` per sequence per step (sampling, detokenizing, one event per sequence) and
``request_overhead_ms`` per request (HTTP, tokenizing, bookkeeping).

- **One request at a time** (llama-cpp-python's server: one ``Llama``, requests served in turn). The engine's
  service time for a request is ``S = k prefill_s + (n - 1) (step(1) + o_step)``; the request's own overhead
  ``o_req`` (HTTP, tokenizing, the client) runs outside it. Alone (c = 1) a request takes ``S + o_req``; in a
  closed loop of c clients the overheads overlap the others' service and each request waits for the c - 1 ahead
  of it: end-to-end ``max(c S, S + o_req)``, TTFT that minus (n - 1) TPOT, TPOT ``step(1) + o_step``, ``c /
  end-to-end`` requests per second (``seq_overhead_ms`` is ``o_step`` here: one sequence per step).
- **Continuous batching** (vLLM). With equal requests in a closed loop the c requests move in step: they arrive
  together, their prompts are prefilled in one step, then B = min(c, max_num_seqs) sequences decode together:
  TTFT ``c k prefill_s + o_step + o_req``, TPOT ``step(B) + o_step + B o_seq``, end-to-end TTFT + (n - 1) TPOT, and
  ``c / end-to-end`` requests per second (Little's law).

In a closed loop with fixed lengths every request sees the same, so each figure's p50 is its mean; the spread a
real server shows (measured p90/p99) is not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from predictor.engines import traits
from predictor.estimate import predict_scenario
from predictor.scenario import Scenario

MODES = ("serial", "continuous")


def serving_figures(mode: str, concurrency: int, output_tokens: int, prefill_s: float, step1_s: float,
                    step_s: float, prefill_scale: float = 1.0, step_overhead_ms: float = 0.0,
                    seq_overhead_ms: float = 0.0, request_overhead_ms: float = 0.0,
                    max_num_seqs: int | None = None) -> dict[str, float]:
    """The formulas of the module docstring: request throughput (1/s), output tokens/s, TTFT, TPOT and end-to-end
    latency (ms). ``step1_s``: one decode step of one sequence; ``step_s``: of the running batch."""
    c, n = max(int(concurrency), 1), max(int(output_tokens), 1)
    o_step, o_seq, o_req = step_overhead_ms / 1000.0, seq_overhead_ms / 1000.0, request_overhead_ms / 1000.0
    prefill = prefill_scale * prefill_s
    if mode == "serial":
        tpot = step1_s + o_step
        service = prefill + (n - 1) * tpot
        # the request's own overhead runs outside the engine: alone it adds to each request; with others
        # waiting it overlaps their service, and the engine, never idle, sets the pace
        e2e = max(c * service, service + o_req)
        ttft = e2e - (n - 1) * tpot
    elif mode == "continuous":
        batch = min(c, int(max_num_seqs or c))
        ttft = c * prefill + o_step + o_req
        tpot = step_s + o_step + batch * o_seq
        e2e = ttft + (n - 1) * tpot
    else:
        raise ValueError(f"unknown serving mode {mode!r} (choose from: {', '.join(MODES)})")
    rate = c / e2e
    return {"request_throughput": rate, "output_tok_s": rate * n, "ttft_ms": 1000.0 * ttft,
            "tpot_ms": 1000.0 * tpot, "e2el_ms": 1000.0 * e2e}


OVERHEADS = {"prefill_scale": 1.0, "step_overhead_ms": 0.0, "seq_overhead_ms": 0.0, "request_overhead_ms": 0.0}


def step_times(scenario: Scenario, concurrency: int, output_tokens: int, coefficients: Any = "default",
               max_num_seqs: int | None = None) -> dict[str, float]:
    """``prefill_s``, ``step1_s`` and ``step_s`` (the running batch's step) for ``scenario``'s prompt, decoding
    halfway through the output, from the analytical model."""
    prompt = int(scenario.prompt_tokens)
    middle = prompt + max(int(output_tokens), 1) // 2
    batch = min(max(int(concurrency), 1), int(max_num_seqs or concurrency))
    one = predict_scenario(scenario.replace(batch=1), coefficients, launch=False).values
    decode1 = predict_scenario(scenario.replace(batch=1, prompt_tokens=middle), coefficients, launch=False).values
    decode = decode1 if batch == 1 else predict_scenario(scenario.replace(batch=batch, prompt_tokens=middle),
                                                         coefficients, launch=False).values
    return {"prefill_s": float(one["prefill_s"]), "step1_s": float(decode1["decode_step_s"]),
            "step_s": float(decode["decode_step_s"])}


def serving_mode(engine: str) -> str:
    return "continuous" if traits(engine).server_batches else "serial"


def predict_load(scenario: Scenario, concurrency: int, output_tokens: int, *, coefficients: Any = "default",
                 overheads: Mapping[str, Any] | None = None, max_num_seqs: int | None = None) -> dict[str, Any]:
    """The module's figures for ``scenario`` at ``concurrency`` requests in flight, with a serving fit's values
    (``overheads``: the keys of :data:`OVERHEADS` and ``source``) or the neutral ones (uncalibrated)."""
    fit = {**OVERHEADS, **{k: v for k, v in (overheads or {}).items() if k in OVERHEADS and v is not None}}
    max_num_seqs = max_num_seqs or scenario.max_num_seqs
    times = step_times(scenario, concurrency, output_tokens, coefficients, max_num_seqs)
    mode = serving_mode(str(scenario.engine))
    figures = serving_figures(mode, concurrency, output_tokens, times["prefill_s"], times["step1_s"], times["step_s"],
                              max_num_seqs=max_num_seqs, **{k: float(v) for k, v in fit.items()})
    source = (overheads or {}).get("source") or "uncalibrated: no serving run fitted (prefill_scale 1, overheads 0)"
    return {"mode": mode, "concurrency": int(concurrency), "prompt_tokens": int(scenario.prompt_tokens),
            "output_tokens": int(output_tokens), **{k: round(v, 4) for k, v in figures.items()},
            "step_times_ms": {k.removesuffix("_s") + "_ms": round(1000.0 * v, 4) for k, v in times.items()},
            "overheads": {**fit, "source": source}}
