"""One serving run: start the engine's server, warm it up, drive each load level, stop it, store the record.

The record is an ordinary run record (:mod:`harness.record_schema`) whose ``config.serve`` holds the levels and
whose ``measurements.serving`` holds, per level, what :func:`harness.serving.loadgen.level_summary` gives over all
the level's rounds (``serve.rounds``: the levels run that many times, interleaved; each round's own throughput and
medians in ``rounds``) plus the server's own metrics over the level (vLLM's ``/metrics``: the most requests running
and waiting, the fullest the KV cache was, preemptions) and the peak memory so far. A server that fails to start,
or whose every request fails, is a failed record with the server's log tail; Ctrl-C stops the server and writes an
``interrupted`` record.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness import records
from harness.engines import engine_setup
from harness.engines.base import classify_failure, engine_class
from harness.engines.runner import install_sigterm, restore_sigterm
from harness.runconfig import log_path_for, prepare_config, prepare_weights
from harness.serving.config import level_requests, request_lengths
from harness.serving.loadgen import level_summary, run_level
from harness.serving.server import ServerFailed, ServerProcess, free_port, read_metrics
from predictor.errors import BenchcalError

METRICS_INTERVAL_S = 0.5
# the server's environment variables a record keeps (how its threads were placed and waited; never a secret)
SERVER_ENV = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "CUDA_VISIBLE_DEVICES")


class _MetricsWatch:
    """Reads the server's metrics every half second during a level: maxima of the gauges, deltas of the counters."""

    def __init__(self, base_url: str, path: str | None, headers: Mapping[str, str] | None = None) -> None:
        self.base_url, self.path, self.headers = base_url, path, headers
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _MetricsWatch:
        if self.path:
            self._read()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        found = read_metrics(self.base_url, self.path or "/metrics", self.headers)
        if found:
            self.samples.append(found)

    def _run(self) -> None:
        while not self._stop.wait(METRICS_INTERVAL_S):
            self._read()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._read()

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        def values(*names: str) -> list[float]:  # the first of the names the server reports (vLLM's, llama-server's)
            for name in names:
                found = [s[name] for s in self.samples if name in s]
                if found:
                    return found
            return []

        def peak(*names: str) -> float | None:
            found = values(*names)
            return max(found) if found else None

        def delta(*names: str) -> float | None:
            found = values(*names)
            return found[-1] - found[0] if found else None

        return {"max_running": peak("vllm:num_requests_running", "llamacpp:requests_processing"),
                "max_waiting": peak("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
                "max_kv_cache_usage": peak("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                "preemptions": delta("vllm:num_preemptions_total"),
                "prompt_tokens": delta("vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
                "generation_tokens": delta("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total"),
                "samples": len(self.samples)}


def _levels(serve: Mapping[str, Any]) -> list[dict[str, Any]]:
    return ([{"concurrency": c, "request_rate": None} for c in serve["concurrency"]]
            + [{"concurrency": None, "request_rate": r} for r in serve["request_rate"]])


def _level_entry(level: Mapping[str, Any], turns: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    """One level's record entry: :func:`level_summary` over the requests of all its rounds (throughputs per second
    of the rounds' wall time together), the server's metrics over them (the gauges' maxima, the counters summed)
    and, with more than one round, each round's own throughput and medians. ``timeline_ms`` keeps, per round, every
    request in the order it was sent: when it was sent (from the round's first send), its TTFT (None where no token
    came) and its end-to-end latency (None unless it completed): which requests a server prefilled together."""
    results = [r for turn in turns for r in turn["results"]]
    summary = level_summary(results, sum(turn["wall"] for turn in turns), prompt_tokens)
    entry = {**level, **summary,
             "arrival_seed": turns[0]["seed"] if level["request_rate"] is not None else None,  # the Poisson draw's
             "server_metrics": _combined_metrics([turn["metrics"] for turn in turns]),
             "peak_bytes_so_far": turns[-1]["peak"],
             "timeline_ms": [_timeline(turn["results"]) for turn in turns]}
    if len(turns) > 1:
        entry["rounds"] = []
        for turn in turns:
            own = level_summary(turn["results"], turn["wall"], prompt_tokens)
            entry["rounds"].append({"completed": own["completed"], "duration_s": own["duration_s"],
                                    "output_tok_s": own["output_tok_s"], "ttft_p50_ms": own["ttft_ms"].get("p50"),
                                    "tpot_p50_ms": own["tpot_ms"].get("p50"), "e2el_p50_ms": own["e2el_ms"].get("p50")})
    return entry


def _timeline(results: list[Any]) -> list[list[float | None]]:
    """``[sent, TTFT, end-to-end]`` ms of each request of one round, in the order sent, sent from the round's first
    send."""
    if not results:
        return []
    ordered = sorted(results, key=lambda r: r.started_s)
    first = ordered[0].started_s

    def ms(value: float | None) -> float | None:
        return None if value is None else round(1000.0 * value, 3)

    return [[ms(r.started_s - first), ms(r.ttft_s), ms(r.e2el_s if r.ok else None)] for r in ordered]


def _combined_metrics(summaries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """:meth:`_MetricsWatch.summary` of several rounds as one: the most running and waiting and the fullest cache of
    any round, the counters' deltas (preemptions, token counts) and the samples added up."""
    found = [s for s in summaries if s]
    if not found:
        return None
    def pick(name: str, how: Callable[[list[float]], float]) -> float | None:
        values = [s[name] for s in found if s.get(name) is not None]
        return how(values) if values else None

    return {**{k: pick(k, max) for k in ("max_running", "max_waiting", "max_kv_cache_usage")},
            **{k: pick(k, sum) for k in ("preemptions", "prompt_tokens", "generation_tokens", "samples")}}


def run_serving(
    config: Mapping[str, Any],
    runs_dir: Any = None,
    *,
    say: Callable[[str], None] | None = None,
    host: Mapping[str, Any] | None = None,
    seed: int | None = None,
    on_ready: Callable[[ServerProcess], None] | None = None,
) -> tuple[dict[str, Any], Any]:
    """Measure one serving configuration (``config["serve"]`` set) and store its record; (record, path).
    ``on_ready(server)`` is called once the server answers, before the load (the tests look at its sockets).

    Raises :class:`harness.protocol.Interrupted` after writing the record when the user interrupts."""
    from harness.hostbench import host_profile
    from harness.protocol import Interrupted, gpu_index
    from harness.provenance import base_provenance
    from harness.samplers import gpu_snapshot

    cfg = prepare_config(config)
    if not cfg.get("serve"):
        raise BenchcalError("a serving run needs a serve table")
    tell = say or print
    serve = cfg["serve"]
    root = records.ensure_writable(records.runs_dir(runs_dir))
    host = dict(host or host_profile())
    index = gpu_index(cfg)
    provenance = base_provenance(cfg, host, gpu_snapshot(index) if index is not None else None)
    weights_path, weights_info = prepare_weights(cfg)
    provenance.update(weights_info)
    setup = engine_setup(cfg["engine"])
    server = setup.server(cfg)
    cls = engine_class(cfg["engine"])
    port = free_port()
    log_path = log_path_for(cfg)
    levels = _levels(serve)
    status, reason, interrupted = "ok", None, False
    failed: ServerFailed | None = None
    done: list[list[dict[str, Any]]] = [[] for _ in levels]  # each level's rounds so far
    startup_s = None
    rng_seed = seed if seed is not None else time.time_ns() % 2**32
    started = time.perf_counter()
    env = server.environment(cfg, os.environ)
    provenance["server_env"] = {key: env[key] for key in SERVER_ENV if key in env}
    process = ServerProcess(server.command(cfg, weights_path, port), log_path, port=port,
                            ready_path=server.ready_path, env=env,
                            startup_timeout_s=float(cfg.get("timeout_s") or 900.0), device_index=index)
    previous_term = install_sigterm()  # SIGTERM ends the run like Ctrl-C: the server stopped, the record written
    try:
        with process:
            startup_s = process.startup_s
            if on_ready is not None:
                on_ready(process)
            _drive(cfg, server, process.base_url, levels, done, tell, rng_seed, weights_path, process.memory)
    except ServerFailed as exc:
        failed = exc
    except KeyboardInterrupt:
        status, reason, interrupted = "interrupted", "interrupted by the user (SIGINT/SIGTERM)", True
    finally:
        restore_sigterm(previous_term)
    memory = process.memory()  # the server is stopped: its samplers' final report
    log_text, tail = process.log_tail()
    if failed is not None:
        returncode = process.proc.returncode if process.proc is not None else None
        status, reason = classify_failure(returncode if returncode is not None else 1, log_text, cls.oom_patterns,
                                          child_error=str(failed))
    version = server.version() or _version(cls)  # a server binary of its own (llama-server): its build
    provenance.update({k: version.get(k) for k in ("engine_version", "engine_commit", "engine_build")})
    provenance["log_file"] = str(log_path)
    record, path = _store(cfg, levels, done, status, reason, memory, provenance, tail,
                          {"startup_s": startup_s, "port": port, "seed": rng_seed}, started, root, tell)
    if interrupted:
        raise Interrupted(path)
    return record, path


def run_external_serving(
    config: Mapping[str, Any],
    runs_dir: Any = None,
    *,
    say: Callable[[str], None] | None = None,
    seed: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], Any]:
    """Measure a server benchcal did not start (``config["serve"]["external"]``: its endpoint, the environment
    variable holding its API key, whether plain HTTP to another host is allowed, the served model) with the same
    levels and record as :func:`run_serving`; (record, path). The server is asked what it is first
    (:func:`harness.serving.external.probe`): its engine and server go into the config, what it says of itself
    (``/v1/models``, ``/version``, whether ``/metrics`` answers) into ``provenance.external_server``. No engine is
    launched and no memory measured (the record's memory says so); the API key is sent with every request and
    written nowhere (the record is searched for it before it is stored)."""
    from harness.hostbench import host_profile
    from harness.protocol import Interrupted
    from harness.provenance import base_provenance, git_commit, harness_version
    from harness.record_schema import CONFIG_DEFAULTS
    from harness.serving.external import EXTERNAL_NOTE, ExternalServer, parse_endpoint, probe, served_quant

    ext = dict((config.get("serve") or {}).get("external") or {})
    endpoint = parse_endpoint(ext.get("endpoint"), api_key_env=ext.get("api_key_env"),
                              allow_insecure=bool(ext.get("allow_insecure")), environ=environ)
    info = probe(endpoint, ext.get("served_model"))
    asked = config.get("engine")
    if asked and asked != info["engine"]:
        raise BenchcalError(f"--engine {asked}: {endpoint.url} is {info['server']}, which runs {info['engine']}")
    context = config.get("context")
    served = next((m for m in info["models"] if str(m.get("id")) == info["served_model"]), {})
    if context is None:  # the server's own context where it says (vLLM's max_model_len), else the harness default
        context = served.get("max_model_len") or CONFIG_DEFAULTS["context"]
    cfg = prepare_config({**config, "engine": info["engine"], "context": int(context),
                          "quant": served_quant(info, config.get("quant")),
                          "serve": {**config["serve"], "server": info["server"]}})
    cfg["engine_options"] = {}  # the server runs as it was started: none of the options benchcal would give it
    tell = say or print
    root = records.ensure_writable(records.runs_dir(runs_dir))
    # the machine the load generator ran on; the server's own only where it is this one (loopback)
    if endpoint.loopback:
        provenance = base_provenance(cfg, dict(host_profile()), None)
    else:
        provenance = {"source": "measured", "harness_version": harness_version(), "git_commit": git_commit(),
                      "command_line": " ".join(sys.argv), "started_at": records.utc_now()}
    provenance["external_server"] = {**info, "client_hostname": socket.gethostname(), "note": EXTERNAL_NOTE}
    server = ExternalServer(endpoint, info)
    levels = _levels(cfg["serve"])
    done: list[list[dict[str, Any]]] = [[] for _ in levels]
    rng_seed = seed if seed is not None else time.time_ns() % 2**32
    status, reason, interrupted = "ok", None, False
    started = time.perf_counter()
    previous_term = install_sigterm()
    try:
        _drive(cfg, server, endpoint.root, levels, done, tell, rng_seed, None, dict, endpoint.headers(),
               api_url=endpoint.api)
    except KeyboardInterrupt:
        status, reason, interrupted = "interrupted", "interrupted by the user (SIGINT/SIGTERM)", True
    finally:
        restore_sigterm(previous_term)
    memory = {"peak_bytes": None, "peak_source": None, "sample_count": 0, "not_measured": EXTERNAL_NOTE}
    provenance.update(server.version())
    provenance["external_server"]["prompts"] = server.info.get("prompts")  # how they were sized
    record, path = _store(cfg, levels, done, status, reason, memory, provenance, [],
                          {"startup_s": None, "port": None, "seed": rng_seed}, started, root, tell,
                          redact=endpoint.redact_all, secret=endpoint.key)
    if interrupted:
        raise Interrupted(path)
    return record, path


def _store(cfg: Mapping[str, Any], levels: list[dict[str, Any]], done: list[list[dict[str, Any]]], status: str,
           reason: str | None, memory: Mapping[str, Any], provenance: dict[str, Any], tail: list[str],
           run: Mapping[str, Any], started: float, root: Any, tell: Callable[[str], None],
           redact: Callable[[Any], Any] | None = None, secret: str | None = None) -> tuple[dict[str, Any], Any]:
    """The serving record of the levels run (``done``), stored; (record, path). A run where no request completed
    is a crash with the first error. ``run``: the run's ``startup_s``, ``port`` and ``seed``; ``redact``: applied
    to the whole record before it is stored; ``secret``: a text the stored record must not hold (refused)."""
    import json

    serve = cfg["serve"]
    prompt_tokens = int(min(cfg["prompt_tokens"] or [128]))
    measured = [_level_entry(level, turns, prompt_tokens) for level, turns in zip(levels, done, strict=True) if turns]
    if status == "ok" and measured and not any(level["completed"] for level in measured):
        messages = [m for level in measured for m in level["error_messages"]]
        status, reason = "crash", f"no request completed: {messages[0] if messages else 'every request timed out'}"
    provenance.update({"finished_at": records.utc_now(), "wall_s": time.perf_counter() - started})
    record = records.new_record(
        cfg, status=status, reason=reason, memory=dict(memory), provenance=provenance, log_tail=tail,
        measurements={"serving": {"prompt_tokens": prompt_tokens, "output_tokens": int(cfg["gen_tokens"]),
                                  "range_ratio": serve.get("range_ratio", 0.0), **run, "levels": measured}},
        prediction=None, prediction_reason="the predictor has no serving model yet",
    )
    record = records.sanitize_record(record)
    if redact is not None:
        record = redact(record)
    if secret and secret in json.dumps(record):
        raise BenchcalError("the serving record held the API key after redaction: not stored")
    return record, records.store_record(record, root, say=tell)


def _drive(cfg: Mapping[str, Any], server: Any, base_url: str, levels: list[dict[str, Any]],
           done: list[list[dict[str, Any]]], tell: Callable[[str], None], rng_seed: int, weights_path: Any,
           memory: Callable[[], dict[str, Any]], headers: Mapping[str, str] | None = None,
           api_url: str | None = None) -> None:
    """Warm the server up and run every level of every round against ``base_url``, each round's results appended
    to its level's list in ``done`` as it ends (so an interrupted run keeps the rounds it finished). ``memory()``:
    the peak so far; ``headers``: sent with every request and metrics read (an external server's API key);
    ``api_url``: the OpenAI API's base (default ``base_url`` + ``/v1``)."""
    serve = cfg["serve"]
    prompt_tokens = int(min(cfg["prompt_tokens"] or [128]))
    output_tokens = int(cfg["gen_tokens"])
    rounds = int(serve.get("rounds") or 1)
    counts = [level_requests(serve, level["request_rate"], level["concurrency"]) for level in levels]
    total = serve["warmup"] + sum(counts) * rounds
    draw = random.Random(rng_seed)  # each request's lengths (all the run's own without a range_ratio)
    prompt_lengths = request_lengths(prompt_tokens, serve.get("range_ratio", 0.0), total, draw)
    output_lengths = request_lengths(output_tokens, serve.get("range_ratio", 0.0), total, draw)
    prompts = server.prompts(cfg, weights_path, base_url, prompt_lengths, rng_seed)
    url = (api_url or base_url + "/v1") + "/completions"
    payloads = [server.payload(p, n) for p, n in zip(prompts, output_lengths, strict=True)]
    if serve["warmup"]:
        tell(f"serving {cfg['model']} with {cfg['engine']}: {serve['warmup']} warm-up request(s)")
        asyncio.run(run_level(url, lambda i: payloads[i], requests=serve["warmup"], concurrency=1,
                              timeout_s=serve["request_timeout_s"], headers=headers))
    offset = serve["warmup"]
    for turn in range(rounds):
        for index, level in enumerate(levels):
            label = (f"concurrency {level['concurrency']}" if level["concurrency"] is not None
                     else f"{level['request_rate']:g} requests/s")
            if rounds > 1:
                label += f" (round {turn + 1} of {rounds})"
            tell(f"serving {cfg['model']} with {cfg['engine']}: {label}, {counts[index]} requests")
            base = offset
            # a request-rate level replays its first round's arrivals (the Poisson draw's seed) in each round
            arrivals = done[index][0]["seed"] if done[index] else rng_seed + base
            with _MetricsWatch(base_url, server.metrics_path, headers) as watch:
                results, wall = asyncio.run(run_level(
                    url, lambda i, base=base: payloads[base + i], requests=counts[index],
                    concurrency=level["concurrency"], request_rate=level["request_rate"],
                    duration_s=serve["duration_s"], timeout_s=serve["request_timeout_s"], seed=arrivals,
                    prompt_tokens=lambda i, base=base: prompt_lengths[base + i], headers=headers))
            offset += counts[index]
            done[index].append({"results": results, "wall": wall, "seed": arrivals,
                                "metrics": watch.summary(), "peak": memory().get("peak_bytes")})


def _version(cls: Any) -> dict[str, Any]:
    """The engine's version, build and commit as the parent can read them (never raises)."""
    try:
        version = cls.version()
    except Exception:  # the record must not depend on the version probe
        return {}
    return version if isinstance(version, dict) else {}
