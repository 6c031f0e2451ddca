"""A record's ``measurements`` from an engine child's events: every sample, summaries and cross-checks."""

from __future__ import annotations

from typing import Any

from harness.engines.base import decode_tok_s, prefill_tok_s
from harness.engines.runner import EngineRun
from harness.records import summarize


def _timed_events(run: EngineRun, kind: str) -> list[dict[str, Any]]:
    return [e["timing"] for e in run.find(kind) if not e.get("warmup")]


def _ratio(engine_value: float | None, wall_value: float | None) -> float | None:
    return engine_value / wall_value if engine_value and wall_value else None


def build_measurements(run: EngineRun) -> dict[str, Any]:
    """The record's ``measurements``: every sample kept, summaries, and engine-timer vs wall-clock checks."""
    out: dict[str, Any] = {}
    loaded = run.find("loaded")
    if loaded:
        out["load_s"] = loaded[0]["load"]["load_s"]
        # What the engine reported on load (vLLM: resolved options, weights inventory; llama.cpp: model size).
        out["load"] = {k: v for k, v in loaded[0]["load"].items() if k != "load_s"}
    by_length: dict[int, list[dict[str, Any]]] = {}
    for timing in _timed_events(run, "prefill"):
        by_length.setdefault(int(timing["prompt_tokens"]), []).append(timing)
    prefill, cross_prefill = [], []
    for length in sorted(by_length):
        timings = by_length[length]
        wall = summarize(prefill_tok_s(length, t["prefill_s"]) for t in timings)
        engine = summarize(prefill_tok_s(t.get("engine_prompt_tokens") or length, t.get("engine_prefill_s"))
                           for t in timings)
        prefill.append({
            "prompt_tokens": length,
            "ttft_ms": summarize(t["ttft_s"] * 1000.0 for t in timings),
            "prefill_tok_s": wall,
            "prefill_ms": summarize(t["prefill_s"] * 1000.0 for t in timings),
            "engine_prefill_tok_s": engine,
        })
        cross_prefill.append({"prompt_tokens": length, "wall_tok_s": wall["median"], "engine_tok_s": engine["median"],
                              "engine_over_wall": _ratio(engine["median"], wall["median"])})
    out["prefill"] = prefill
    decode_timings = _timed_events(run, "decode")
    cross: dict[str, Any] = {"prefill": cross_prefill}
    if decode_timings:
        first = decode_timings[0]
        wall = summarize(decode_tok_s(t["token_times_s"], int(t.get("batch") or 1)) for t in decode_timings)
        engine = summarize((t["engine_decode_tokens"] / t["engine_decode_s"])
                           if t.get("engine_decode_s") and t.get("engine_decode_tokens") else None
                           for t in decode_timings)
        gap_medians_ms = [summarize(_gaps_ms(t["token_times_s"]))["median"] for t in decode_timings]
        out["decode"] = {
            "gen_tokens": len(first["token_times_s"]),
            "context_at_start": first["context_at_start"],
            "decode_tok_s": wall,
            "engine_decode_tok_s": engine,
            "inter_token_ms": summarize(gap_medians_ms),
            "ttft_ms": summarize((t["token_times_s"][0] - t["submit_s"]) * 1000.0 for t in decode_timings),
        }
        cross["decode"] = {"wall_tok_s": wall["median"], "engine_tok_s": engine["median"],
                           "engine_over_wall": _ratio(engine["median"], wall["median"])}
    cross["note"] = "engine_over_wall = engine-timer rate / wall-clock rate; above 1 means harness overhead"
    out["crosscheck"] = cross
    return out


def _gaps_ms(times_s: list[float]) -> list[float]:
    """Milliseconds between consecutive token timestamps."""
    return [(later - earlier) * 1000.0 for earlier, later in zip(times_s[:-1], times_s[1:], strict=True)]
