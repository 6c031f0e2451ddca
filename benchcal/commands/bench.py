"""Measurement commands: ``bench`` (measure configs with a real engine) and ``runs`` (list stored runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchcal.argtypes import non_negative_int, positive_float, positive_int
from benchcal.commands.comparison import NullFile, fmt, render_comparison, render_serving
from harness import record_tables, records
from harness.engines import ENGINES, engine_setup
from predictor.errors import BenchcalError, positive
from predictor.load import SERVER_NAMES

RAW = argparse.RawDescriptionHelpFormatter
GIB = 2**30

BENCH_EPILOG = """\
examples:
  benchcal bench                              # calibrate this machine if no run describes it, else check it
  benchcal bench --gpu cpu --model smollm2-135m --quant Q8_0 --ctx 2048 --prompt 64,256 --gen 32
  benchcal bench --gpu auto --model llama-3.1-8b --quant Q4_K_M --ctx 8192 --prompt 512,2048
  benchcal bench --gpu l4 --model qwen2.5-7b --weights ./qwen2.5-7b-instruct-q4_k_m.gguf
  benchcal bench --sweep cpu-smoke            # a shipped sweep (harness/sweeps/cpu-smoke.toml); resumes
  benchcal bench --sweep my-sweep.toml --runs-dir ./my-runs
  benchcal bench --serve --endpoint https://gpu-box.example/v1 --api-key-env MY_KEY --gpu h100-sxm \
      --model llama-3.1-8b --quant BF16 --concurrency 1,4,8   # a server that is already running

Weights are synthetic by default: a GGUF with the model's real tensor shapes and random values, built
once and cached under ~/.cache/benchcal (BENCHCAL_CACHE). Speed and memory do not depend on the values.
Without --model and --sweep, bench calibrates a device no run describes (CPU hosts by model, ISA and
cores): it measures harness/sweeps/host-calibration.toml (about 3.5 minutes on 2 cores), fits it over the
shipped table into $BENCHCAL_HOME/calibration and prints measured vs predicted before and after, and
predictions for configurations it did not measure; on a calibrated device it measures the smoke sweep.
Every run is stored as one JSON record under your runs directory (--runs-dir, BENCHCAL_RUNS, else
$BENCHCAL_HOME/runs: never the shipped runs/), failed ones too (status oom, crash, timeout, interrupted).
Exit status: 0 when every run is ok, 1 when some run failed, 2 on bad input.
"""

RUNS_EPILOG = """\
examples:
  benchcal runs
  benchcal runs --format csv > runs.csv
  benchcal runs --model smollm2-135m --status ok --format json
"""

TABLE_COLUMNS = ("id", "status", "model", "quant", "engine", "device", "context", "prompt_tokens", "ttft_ms",
                 "prefill_tok_s", "decode_tok_s", "pred_decode_tok_s", "peak_memory_bytes", "pred_verdict")


def register(subparsers: Any) -> None:
    """Add the ``bench`` and ``runs`` subcommands."""
    bench = subparsers.add_parser("bench", help="measure configs with llama.cpp or vLLM and store run records",
                                  description="Measure load time, TTFT, prefill and decode throughput and peak "
                                  "memory of a config with a real engine, next to the predictor's figures.",
                                  epilog=BENCH_EPILOG, formatter_class=RAW)
    bench.add_argument("--gpu", default="auto", help="auto (the NVIDIA GPU if there is one, else cpu), cpu, or the "
                       "catalogue id of this machine's GPU (default auto)")
    bench.add_argument("--model", help="catalogue model id (smollm2-135m, llama-3.1-8b, ...)")
    bench.add_argument("--engine", default=None, help="llama.cpp, vllm, or transformers (a torch fallback on GPUs; "
                       "default llama.cpp; with --endpoint, the engine the server says it runs)")
    bench.add_argument("--quant", default=None, help="weight format: F16, Q8_0, Q4_0, Q4_K_M, ... "
                       "(default Q4_K_M for llama.cpp; with --endpoint, the format the server serves)")
    bench.add_argument("--ctx", type=positive_int, default=None, help="context length in tokens (default 2048; with "
                       "--endpoint, the server's own where it says)")
    bench.add_argument("--prompt", default="128,512", help="prompt lengths in tokens, comma-separated (default 128,512)")
    bench.add_argument("--gen", type=non_negative_int, default=64, help="tokens to generate per decode run (default 64)")
    bench.add_argument("--reps", type=positive_int, default=5, help="measured repetitions (default 5)")
    bench.add_argument("--warmup", type=non_negative_int, default=1, help="warm-up runs before the repetitions (default 1)")
    bench.add_argument("--kv-dtype", default="f16", help="KV cache dtype: f16, q8_0, ... (default f16)")
    bench.add_argument("--flash-attn", action="store_true", help="enable flash attention (llama.cpp)")
    bench.add_argument("--n-gpu-layers", type=int, default=None, help="layers on the GPU (llama.cpp; default all)")
    bench.add_argument("--weights", default="synthetic", help="synthetic (default), hub, or a path to a .gguf")
    bench.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: physical cores, "
                       "one fewer without SMT so the memory sampler has a hardware thread)")
    bench.add_argument("--override", action="append", default=[], metavar="KEY=N",
                       help="shrink a synthetic model, e.g. --override num_layers=4 --override vocab_size=4096 "
                       "(also max_context, and a mixture of experts' num_experts, experts_per_token; recorded in "
                       "the config)")
    bench.add_argument("--serve", action="store_true", help="measure the engine's OpenAI-compatible server under "
                       "load instead (one prompt length: the first of --prompt; --gen tokens per request)")
    bench.add_argument("--concurrency", default=None, help="with --serve: requests in flight, comma-separated "
                       "levels (default 1 when no --request-rate)")
    bench.add_argument("--request-rate", default=None, help="with --serve: Poisson arrivals, requests per second, "
                       "comma-separated levels")
    bench.add_argument("--requests", type=positive_int, default=16, help="with --serve: requests per level in each "
                       "round (default 16)")
    bench.add_argument("--server", choices=SERVER_NAMES, default=None,
                       help="with --serve: the server to measure (llama.cpp: llama-server, its own binary, the "
                       "default where one exists ($BENCHCAL_LLAMA_SERVER, else on PATH), or llama-cpp-python's "
                       "llama_cpp.server; vLLM: vllm)")
    bench.add_argument("--rounds", type=positive_int, default=1, help="with --serve: run the levels this many times, "
                       "interleaved, each level's figures over all its rounds (default 1)")
    bench.add_argument("--range-ratio", default=None, help="with --serve: each request's prompt and output lengths "
                       "drawn uniformly from L x (1 - R) to L x (1 + R) around --prompt and --gen, as vllm bench "
                       "serve's --random-range-ratio (0 to below 1; default 0, every request the same)")
    bench.add_argument("--endpoint", default=None, metavar="URL",
                       help="with --serve: drive a server that is already running (vLLM, llama-server, "
                       "llama-cpp-python's) at its OpenAI API base, http://HOST:PORT/v1 or https://HOST/v1, "
                       "instead of starting one; --gpu names the device it runs on, --model what it serves")
    bench.add_argument("--api-key-env", default=None, metavar="NAME",
                       help="with --endpoint: the environment variable holding the server's API key (sent as a "
                       "bearer token; the key is written nowhere)")
    bench.add_argument("--allow-insecure", action="store_true",
                       help="with --endpoint: allow plain http:// to a host other than loopback")
    bench.add_argument("--served-model", default=None, metavar="NAME",
                       help="with --endpoint: the model id to request, where the server serves several")
    bench.add_argument("--trust-remote-code", action="store_true", help="allow a configuration's engine option "
                       "trust_remote_code (vLLM runs the model repository's own Python code); without this flag "
                       "such a configuration is refused")
    bench.add_argument("--sweep", default=None, help="a sweep TOML file, or the name of a shipped sweep")
    bench.add_argument("--no-resume", action="store_true", help="with --sweep: re-measure configs already stored")
    bench.add_argument("--timeout", type=positive_float, default=None, help="seconds per run before it is killed (default 900)")
    bench.add_argument("--runs-dir", default=None, help="where records go (default: $BENCHCAL_RUNS, else "
                       "$BENCHCAL_HOME/runs)")
    bench.set_defaults(func=cmd_bench)

    runs = subparsers.add_parser("runs", help="list stored run records", description="List stored run records "
                                 "as a table, JSON or CSV (one row per run, flat columns).",
                                 epilog=RUNS_EPILOG, formatter_class=RAW)
    runs.add_argument("--format", choices=("table", "json", "csv"), default="table", help="output format")
    runs.add_argument("--runs-dir", default=None, help="records directory (default: $BENCHCAL_RUNS, else "
                      "$BENCHCAL_HOME/runs)")
    runs.add_argument("--model", default=None, help="only this model")
    runs.add_argument("--engine", default=None, help="only this engine")
    runs.add_argument("--device", default=None, help="only this device")
    runs.add_argument("--status", default=None, help="only this status (ok, oom, crash, timeout, interrupted)")
    runs.set_defaults(func=cmd_runs)


# ------------------------------------------------------------------------------------------------ device


def _nvml_gpu_name() -> str | None:
    from harness.samplers import gpu_snapshot

    snap = gpu_snapshot(0)
    return snap.get("device_name") if snap else None


def _catalogue_id(name: str) -> str:
    """The catalogue id for a device name, or a slug of the name when the catalogue does not know it."""
    try:
        from predictor.devices import resolve_device

        return resolve_device(name).id
    except (ImportError, BenchcalError):
        return records.safe_component(name).lower()


def resolve_bench_device(requested: str) -> str:
    """``cpu``, or the catalogue id of this machine's GPU; BenchcalError when ``requested`` is another GPU."""
    wanted = (requested or "auto").strip()
    if wanted.lower() == "cpu":
        return "cpu"
    gpu_name = _nvml_gpu_name()
    if wanted.lower() == "auto":
        return _catalogue_id(gpu_name) if gpu_name else "cpu"
    from predictor.devices import resolve_device

    device = resolve_device(wanted)
    if gpu_name is None:
        raise BenchcalError(f"--gpu {wanted}: no NVIDIA GPU found on this machine (use --gpu cpu or --gpu auto)")
    present = _catalogue_id(gpu_name)
    if present != device.id:
        raise BenchcalError(f"--gpu {wanted}: this machine's GPU is {gpu_name} ({present}), not {device.name}")
    return device.id


# ------------------------------------------------------------------------------------------------- bench


def _prompt_lengths(text: str) -> list[int]:
    try:
        lengths = [int(p) for p in str(text).replace(" ", "").split(",") if p]
    except ValueError as exc:
        raise BenchcalError(f"--prompt takes comma-separated token counts, got {text!r}") from exc
    if not lengths or min(lengths) <= 0:
        raise BenchcalError(f"--prompt takes positive token counts, got {text!r}")
    return lengths


def config_from_args(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """One run config from the ``bench`` flags."""
    weights_is_path = args.weights not in ("synthetic", "hub")
    model = args.model or (Path(args.weights).stem if weights_is_path else None)
    if not model:
        raise BenchcalError("bench needs --model (or --sweep FILE)")
    options: dict[str, Any] = {"flash_attn": bool(args.flash_attn)}
    if args.n_gpu_layers is not None:
        options["n_gpu_layers"] = args.n_gpu_layers
    if args.threads:
        options["threads"] = int(positive("--threads", args.threads))
    engine = (args.engine or "llama.cpp").strip().lower()
    overrides = _overrides(args.override)
    config = {
        "model": model, "engine": engine, "device": device,
        "quant": args.quant or (engine_setup(engine).default_quant if engine in ENGINES and not weights_is_path else None),
        "weights": args.weights, "model_source": "path" if weights_is_path else "catalogue",
        "context": int(positive("--ctx", args.ctx or 2048)), "prompt_tokens": _prompt_lengths(args.prompt),
        "gen_tokens": int(args.gen), "reps": int(positive("--reps", args.reps)), "warmup": int(args.warmup),
        "kv_dtype": args.kv_dtype, "engine_options": options,
    }
    if overrides:
        config["arch_overrides"] = overrides
    if args.serve:
        config["serve"] = {"concurrency": _levels(args.concurrency, "--concurrency", int),
                           "request_rate": _levels(args.request_rate, "--request-rate", float),
                           "requests": args.requests, "rounds": args.rounds, "server": args.server}
        if args.range_ratio is not None:
            config["serve"]["range_ratio"] = _ratio(args.range_ratio)
        if args.endpoint is not None:
            _external(args, config)
    elif args.endpoint is not None:
        raise BenchcalError("--endpoint measures a running server under load: add --serve")
    elif args.concurrency or args.request_rate or args.rounds != 1 or args.server or args.range_ratio is not None:
        raise BenchcalError("--concurrency, --request-rate, --rounds, --range-ratio and --server describe a load: "
                            "add --serve")
    return config


def _external(args: argparse.Namespace, config: dict[str, Any]) -> None:
    """``serve.external`` from ``--endpoint`` and its flags, checked before anything is sent (the key is read, and
    the server asked what it is, when the run starts)."""
    from harness.serving.external import normalize_external

    if args.server:
        raise BenchcalError("--server chooses a server for benchcal to start; with --endpoint the server is the one "
                            "running there")
    if args.weights != "synthetic" or args.override or args.flash_attn or args.n_gpu_layers is not None or args.threads:
        raise BenchcalError("--weights, --override, --flash-attn, --n-gpu-layers and --threads configure an engine "
                            "benchcal starts; with --endpoint the server runs as it was started")
    config["serve"]["external"] = normalize_external({
        "endpoint": args.endpoint, "api_key_env": args.api_key_env, "allow_insecure": bool(args.allow_insecure),
        "served_model": args.served_model})
    config.update({"weights": "external", "engine_options": {}, "quant": args.quant})
    if args.ctx is None:
        config.pop("context")  # the server's own where it says (vLLM's max_model_len)
    if args.engine is None:
        config.pop("engine")  # the server says which it runs


def _levels(text: str | None, flag: str, kind: type) -> list:
    """Comma-separated load levels (checked again with the rest of the serve table)."""
    if not text:
        return []
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BenchcalError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def _ratio(text: str) -> float:
    """--range-ratio's number (its range is checked with the rest of the serve table)."""
    try:
        return float(text)
    except ValueError:
        raise BenchcalError(f"--range-ratio takes a number from 0 to below 1, got {text!r}") from None


def _overrides(items: list[str]) -> dict[str, int]:
    """``["num_layers=4"]`` -> ``{"num_layers": 4}``."""
    out: dict[str, int] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise BenchcalError(f"--override takes KEY=N (e.g. num_layers=4), got {item!r}")
        out[key.strip()] = int(value)
    return out


class _Progress:
    """A rich progress bar fed by the child's events."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.task: Any = None

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def start(self, config: dict[str, Any]) -> None:
        runs = int(config["warmup"]) + int(config["reps"])
        phases = len(config["prompt_tokens"]) + (1 if int(config["gen_tokens"]) >= 2 else 0)
        shrunk = "".join(f" {k.replace('num_', '')}={v}" for k, v in sorted((config.get("arch_overrides") or {}).items()))
        label = f"{config['model']}{shrunk} {config.get('quant') or ''} ctx {config['context']} on {config['device']}"
        self.task = self.progress.add_task(label, total=1 + phases * runs)

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("event") in ("loaded", "prefill", "decode"):
            self.progress.advance(self.task)

    def say(self, message: str) -> None:
        self.console.print(f"[yellow]{message}[/yellow]")


def cmd_bench(args: argparse.Namespace) -> int:
    from harness.protocol import prepare_config
    from harness.runconfig import permit_remote_code

    permit_remote_code(bool(args.trust_remote_code))
    root = records.ensure_writable(records.runs_dir(args.runs_dir))  # before anything is measured
    device = _external_device(args) if args.endpoint else resolve_bench_device(args.gpu)
    if not args.sweep and not args.model and args.weights == "synthetic":
        from benchcal.commands.host_calibration import run_default

        return run_default(args, root, device, lambda configs, timeout: _measure(configs, root, timeout))
    if args.sweep:
        from harness.sweep import load_sweep, pending

        sweep = load_sweep(args.sweep)
        configs = [prepare_config(_sweep_config(c, args, device)) for c in sweep.configs]
        host_id = _host_id() if device == "cpu" else None
        todo, skipped = pending(configs, root, host_id) if not args.no_resume else (configs, [])
        timeout = args.timeout or sweep.timeout_s
        print(f"sweep {sweep.name}: {len(todo)} to run, {len(skipped)} already measured", file=sys.stderr)
    else:
        todo, timeout = [config_from_args(args, device)], args.timeout
    outcomes = _measure(todo, root, timeout)
    batch = [o for o in outcomes if not o.record["config"].get("serve")]
    serving = [o for o in outcomes if o.record["config"].get("serve")]
    if batch:
        print(render_comparison([o.record for o in batch], [str(o.path) for o in batch]))
    if serving:
        print(render_serving([o.record for o in serving]))
    return 0 if all(o.record["status"] == "ok" for o in outcomes) else 1


def _external_device(args: argparse.Namespace) -> str:
    """The device a running server is on: this machine's (as ``--gpu`` resolves it here) for a loopback endpoint,
    else the catalogue device ``--gpu`` names (nothing here to check it against)."""
    from harness.serving.external import parse_endpoint
    from predictor.devices import resolve_device

    if args.sweep:
        raise BenchcalError("--endpoint measures one server: it does not take --sweep")
    endpoint = parse_endpoint(args.endpoint, api_key_env=args.api_key_env, allow_insecure=bool(args.allow_insecure),
                              read_key=False)
    if endpoint.loopback:
        return resolve_bench_device(args.gpu)
    wanted = (args.gpu or "auto").strip().lower()
    if wanted in ("auto", "cpu"):
        raise BenchcalError(f"--endpoint {endpoint.url} is another host: name the GPU it runs on with --gpu "
                            "(a catalogue id; a remote CPU host cannot be described from here)")
    return resolve_device(args.gpu).id


def _host_id() -> str:
    from harness.hostinfo import host_identity

    return host_identity()["host_id"]


def _measure(configs: list[dict[str, Any]], root: Path, timeout: float | None) -> list[Any]:
    """Run each config through the harness with a progress bar; the stored outcomes."""
    from harness.protocol import Interrupted, prepare_config, run_config
    from harness.serving.run import run_external_serving, run_serving

    outcomes = []
    with _Progress() as progress:
        for config in configs:
            external = (config.get("serve") or {}).get("external")
            if not external:
                progress.start(prepare_config(config))
            try:
                if external:  # a running server: asked what it is, then driven
                    record, path = run_external_serving(config, root, say=progress.say)
                    outcomes.append(SimpleNamespace(record=record, path=path))
                elif config.get("serve"):
                    record, path = run_serving(config if timeout is None else {**config, "timeout_s": timeout}, root,
                                               say=progress.say)
                    outcomes.append(SimpleNamespace(record=record, path=path))
                else:
                    outcomes.append(run_config(config, root, timeout_s=timeout, on_event=progress.on_event,
                                               say=progress.say))
            except Interrupted as stop:
                progress.say(f"interrupted; record written to {stop.path}")
                raise
    return outcomes


def _sweep_config(config: dict[str, Any], args: argparse.Namespace, device: str) -> dict[str, Any]:
    """A sweep config with ``device = "auto"`` resolved and ``--threads`` applied."""
    out = dict(config)
    if str(out.get("device", "auto")).lower() == "auto":
        out["device"] = device
    elif str(out["device"]).lower() != "cpu":
        out["device"] = resolve_bench_device(str(out["device"]))
    if args.threads:
        out["engine_options"] = {**(out.get("engine_options") or {}), "threads": args.threads}
    return out


# -------------------------------------------------------------------------------------------------- runs


def cmd_runs(args: argparse.Namespace) -> int:
    root = records.runs_dir(args.runs_dir)
    if args.runs_dir and not Path(root).is_dir():
        raise BenchcalError(f"--runs-dir {args.runs_dir}: no such directory")
    frame = record_tables.load_runs(root,
                              on_error=lambda path, message: print(f"benchcal: skipping {path}: {message}",
                                                                   file=sys.stderr))
    for column in ("model", "engine", "device", "status"):
        wanted = getattr(args, column)
        if wanted:
            frame = frame[frame[column] == wanted]
    if args.format == "csv":
        sys.stdout.write(frame.to_csv(index=False))
    elif args.format == "json":
        sys.stdout.write(json.dumps(json.loads(frame.to_json(orient="records")), indent=1) + "\n")
    else:
        print(_runs_table(frame))
    return 0


def _runs_table(frame: Any) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(frame)} runs")
    for column in TABLE_COLUMNS:
        table.add_column(column)
    for row in frame.to_dict(orient="records"):
        cells = []
        for column in TABLE_COLUMNS:
            value = row.get(column)
            if column == "peak_memory_bytes" and value == value and value is not None:
                value = f"{value / GIB:.2f} GiB"
            cells.append(fmt(value))
        table.add_row(*cells)
    console = Console(record=True, width=200, file=NullFile())
    console.print(table)
    return console.export_text()
