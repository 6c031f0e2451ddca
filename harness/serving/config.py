"""A run's ``serve`` table: the load levels and their bounds, checked and with defaults filled in.

    serve = {server = "llama-server", concurrency = [1, 2, 4], request_rate = [], requests = 16, rate_requests = 16,
             rounds = 1, warmup = 2, duration_s = 300, request_timeout_s = 300, max_num_seqs = 4, range_ratio = 0}

``server``: which server runs the engine (llama.cpp: ``llama-server``, its own binary, the default where one exists
(``$BENCHCAL_LLAMA_SERVER``, else on PATH), or ``llama-cpp-python``, the bindings' ``llama_cpp.server``; vLLM:
``vllm``), resolved with the engine when the run is prepared; ``concurrency``: levels of that many requests in
flight; ``request_rate``: levels of Poisson arrivals at that many requests per second; ``requests``: the requests
of each level in each round, one number for every level or a list of one per concurrency level, in the order of
``concurrency`` (``[8, 16, 16, 16]``: a level of 1 in flight sends 8, the others 16); ``rate_requests``: of each
request-rate level (default ``requests``; required where ``requests`` is a list); ``rounds``: how
many times the levels run, interleaved (1, 2, 4, 1, 2, 4, ...), each level's figures taken over all its rounds'
requests (a drift of the host during the run then falls on every level alike; a request-rate level replays the same
arrivals in each round); ``warmup``: requests sent one at a time
before the first level, not recorded; ``duration_s``: no request of a level starts after this many seconds (in
each round); ``max_num_seqs``: the most sequences the server holds at once (default: the highest concurrency, 16
with request rates only), which is the run's ``batch``; ``range_ratio`` (default 0, below 1): each request's
prompt and output lengths are drawn uniformly from ``[int(L x (1 - r)), int(L x (1 + r))]`` around the run's lengths,
as ``vllm bench serve --random-range-ratio`` draws them (at least one token each; the draw's seed is the record's
``measurements.serving.seed``). A serving run measures ``prompt_tokens[0]``-token prompts generating ``gen_tokens``
tokens each (their means with a ``range_ratio``). ``external``: a server that is already running, which the run
drives instead of starting one (``{endpoint, api_key_env, allow_insecure, served_model}``:
:mod:`harness.serving.external`); its engine and ``server`` are what the server says it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from predictor.errors import BenchcalError

SERVE_KEYS = ("server", "concurrency", "request_rate", "requests", "rate_requests", "rounds", "warmup", "duration_s",
              "request_timeout_s", "max_num_seqs", "range_ratio", "external")
DEFAULT_RATE_ONLY_SEQS = 16


def _numbers(value: Any, name: str, kind: type) -> list:
    values = value if isinstance(value, (list, tuple)) else ([] if value is None else [value])
    out = []
    for item in values:
        try:
            number = kind(item)
        except (TypeError, ValueError):
            raise BenchcalError(f"serve.{name} must hold numbers, got {item!r}") from None
        if isinstance(item, bool) or not math.isfinite(number) or number <= 0 or (kind is int and number != float(item)):
            raise BenchcalError(f"serve.{name} must hold positive {'integers' if kind is int else 'numbers'}, got {item!r}")
        out.append(number)
    return out


def _positive(serve: Mapping[str, Any], name: str, default: float, kind: type = float, zero: bool = False) -> Any:
    value = serve.get(name, default)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise BenchcalError(f"serve.{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        raise BenchcalError(f"serve.{name} must be {'zero or ' if zero else ''}positive, got {value!r}")
    if kind is int and number != float(value):
        raise BenchcalError(f"serve.{name} must be a whole number, got {value!r}")
    return number


def normalize_serve(serve: Any) -> dict[str, Any]:
    """The ``serve`` table with defaults; BenchcalError naming the first problem."""
    if not isinstance(serve, Mapping):
        raise BenchcalError(f"serve must be a table of options, got {serve!r}")
    unknown = sorted(set(serve) - set(SERVE_KEYS))
    if unknown:
        raise BenchcalError(f"serve has no option {unknown[0]!r} (options: {', '.join(SERVE_KEYS)})")
    given = _numbers(serve.get("concurrency"), "concurrency", int)
    concurrency = sorted(set(given))
    rates = sorted(set(_numbers(serve.get("request_rate"), "request_rate", float)))
    if not concurrency and not rates:
        given = concurrency = [1]
    seqs = serve.get("max_num_seqs")
    server = serve.get("server")
    if server is not None and not isinstance(server, str):
        raise BenchcalError(f"serve.server must be a server's name, got {server!r}")
    out = {
        "server": server,
        "concurrency": concurrency,
        "request_rate": rates,
        "requests": _requests(serve, given, concurrency, rates),
        "rounds": _positive(serve, "rounds", 1, int),
        "warmup": _positive(serve, "warmup", 2, int, zero=True),
        "duration_s": _positive(serve, "duration_s", 300.0),
        "request_timeout_s": _positive(serve, "request_timeout_s", 300.0),
        "max_num_seqs": _positive(serve, "max_num_seqs", 0, int) if seqs is not None
        else (max(concurrency) if concurrency else DEFAULT_RATE_ONLY_SEQS),
    }
    if serve.get("rate_requests") is not None:  # kept only where set, as range_ratio
        out["rate_requests"] = _positive(serve, "rate_requests", 0, int)
    if serve.get("external") is not None:  # a server benchcal did not start (harness.serving.external)
        from harness.serving.external import normalize_external

        out["external"] = normalize_external(serve["external"])
    ratio = _ratio(serve)
    if ratio:  # kept only where lengths are drawn: a table without one names the same run as before the option
        out["range_ratio"] = ratio
    return out


def _requests(serve: Mapping[str, Any], given: list[int], concurrency: list[int], rates: list[float]) -> int | list[int]:
    """``serve.requests``: one positive number, or a list of one per concurrency level in the order ``concurrency``
    gives them, returned in the levels' ascending order (the order they run in)."""
    if not isinstance(serve.get("requests"), (list, tuple)):
        return _positive(serve, "requests", 16, int)
    counts = _numbers(serve["requests"], "requests", int)
    if len(counts) != len(given):
        raise BenchcalError(f"serve.requests has {len(counts)} number(s) for {len(given)} concurrency level(s): give "
                            "one number for every level, or one per concurrency level")
    if rates and serve.get("rate_requests") is None:
        raise BenchcalError("serve.requests is a list of one per concurrency level: set serve.rate_requests for the "
                            "request-rate levels")
    per_level: dict[int, int] = {}
    for level, count in zip(given, counts, strict=True):
        if per_level.setdefault(level, count) != count:
            raise BenchcalError(f"serve.requests gives concurrency {level} two request counts ({per_level[level]} "
                                f"and {count})")
    return [per_level[level] for level in concurrency]


def level_requests(serve: Mapping[str, Any], request_rate: float | None, concurrency: int | None = None) -> int:
    """The requests of one level in each round: ``rate_requests`` for a request-rate level where set, else
    ``requests`` (of a list, the entry of the level of ``concurrency`` requests in flight)."""
    if request_rate is not None and serve.get("rate_requests"):
        return int(serve["rate_requests"])
    requests = serve["requests"]
    if isinstance(requests, (list, tuple)):
        return int(requests[list(serve["concurrency"]).index(int(concurrency))])
    return int(requests)


def _ratio(serve: Mapping[str, Any]) -> float:
    ratio = _positive(serve, "range_ratio", 0.0, zero=True)
    if ratio >= 1.0:
        raise BenchcalError(f"serve.range_ratio must be below 1 (lengths of L x (1 - r) to L x (1 + r)), got {ratio!r}")
    return ratio


def request_lengths(length: int, ratio: float, count: int, rng: Any) -> list[int]:
    """``count`` lengths drawn uniformly from ``[int(length x (1 - ratio)), int(length x (1 + ratio))]`` (at least
    1; every one ``length`` when ``ratio`` is 0) with ``rng`` (a :class:`random.Random`)."""
    low, high = max(1, int(length * (1.0 - ratio))), max(1, int(length * (1.0 + ratio)))
    return [rng.randint(low, high) if high > low else low for _ in range(count)]
