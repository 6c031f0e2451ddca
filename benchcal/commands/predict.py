"""Prediction commands: predict, leaderboard, matrix, recommend, models, gpus."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchcal.argtypes import (
    fraction,
    non_negative_float,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
    share,
)
from benchcal.reports.predictions import (
    add_load_section,
    add_rate_section,
    catalogue_devices_report,
    catalogue_models_report,
    leaderboard_report,
    load_curve_charts,
    matrix_report,
    predict_report,
    rate_curve_charts,
    recommend_report,
)
from benchcal.reports.render import FORMATS, render
from predictor.coefficients import Coefficients, default_coefficients, load_coefficients
from predictor.devices import Device, load_devices, resolve_device
from predictor.eras import era_for_build
from predictor.errors import BenchcalError, positive
from predictor.estimate import predict_scenario
from predictor.load import SERVER_NAMES, check_server, predict_load, predict_rate, serving_key
from predictor.models import load_catalogue, resolve_model
from predictor.quants import default_format, normalize_engine
from predictor.scenario import DEFAULT_PROMPT_TOKENS, Scenario, require_context

RAW = argparse.RawDescriptionHelpFormatter


def _add_common(p: argparse.ArgumentParser, *, gpu: bool = True, quant: bool = True, ctx: bool = True) -> None:
    p.add_argument("--model", required=True, help="catalogue id (qwen2.5-72b), HF id, config.json, HF dir or .gguf")
    if gpu:
        p.add_argument("--gpu", required=True, help="device id or NVML name (l4, h100-sxm, 'NVIDIA GeForce RTX 4090'), or cpu")
    if quant:
        p.add_argument("--quant", default=None, help="Q4_K_M, Q8_0, F16, BF16, FP8, AWQ, ... (default: the GGUF's "
                       "own, else the format the release ships in where the engine runs it (gpt-oss: MXFP4), else "
                       "Q4_K_M for llama.cpp / BF16 for vLLM, in every command)")
    if ctx:
        p.add_argument("--ctx", type=positive_int, default=8192, help="context length in tokens (default 8192)")
    p.add_argument("--engine", default="llama.cpp", help="llama.cpp or vllm (default llama.cpp)")
    p.add_argument("--coefficients", default=None, help="coefficients.json from `benchcal calibrate` (default: the "
                   "shipped calibration/coefficients.json, with your own fit's devices over it)")
    p.add_argument("--defaults", action="store_true", help="ignore calibrated coefficients; use engine defaults")
    p.add_argument("--cpu-bw-gbs", type=positive_float, default=None, help="host memory bandwidth, GB/s (default: measured)")
    p.add_argument("--cpu-tflops", type=positive_float, default=None, help="host matmul rate, TFLOPS (default: measured with "
                   "llama.cpp's F16 kernels)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--output", "-o", type=output_file, default=None, help="write to FILE instead of stdout")


def _table(args) -> Coefficients:
    if getattr(args, "defaults", False):
        return Coefficients()
    return load_coefficients(args.coefficients) if args.coefficients else default_coefficients()


def host_device(args, table: Coefficients | None = None) -> Device:
    """The host CPU as a device, under its calibration id: bandwidth and matmul rate from flags, else the figures
    its calibration was fitted against (a calibrated host), else the harness's probes (``harness.hostbench``:
    llama.cpp's own F16 decode and prefill)."""
    bw, tflops = getattr(args, "cpu_bw_gbs", None), getattr(args, "cpu_tflops", None)
    from harness.hostbench import host_cpu_device

    if bw is not None:
        positive("--cpu-bw-gbs", bw)
    if tflops is not None:
        positive("--cpu-tflops", tflops)
    engine = normalize_engine(getattr(args, "engine", None) or "llama.cpp")
    return host_cpu_device(engine, None, table, bandwidth_gbs=bw, tflops=tflops)


def resolve_gpu(args, table: Coefficients | None = None) -> Device:
    if args.gpu.strip().lower() == "cpu":
        return host_device(args, table)
    return resolve_device(args.gpu)


def emit(text: str, args) -> None:
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def scenario_from_args(args, dev: Device) -> Scenario:
    """The scenario ``benchcal predict``'s arguments describe, on the resolved device ``dev``."""
    return Scenario(
        model=resolve_model(args.model), device=dev, engine=args.engine, quant=args.quant, context=args.ctx,
        prompt_tokens=args.prompt, prompt_depth=args.prompt_depth, batch=args.batch, kv_dtype=args.kv_dtype,
        flash_attn=not args.no_flash_attn,
        n_ubatch=args.n_ubatch, offload_fraction=args.offload, device_count=args.gpus, engine_build=args.engine_build,
        host_bandwidth_gbs=args.host_bw_gbs or (dev.bandwidth_gbs if dev.kind == "cpu" else None),
        host_memory_gib=args.host_mem_gib, gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        flashinfer_sampler=args.vllm_sampler == "flashinfer", server=args.server, backend=args.backend,
    )


def prompt_tokens(args) -> int:
    """``--prompt``, refused above ``--ctx``; by default 4096 tokens, or the context when shorter."""
    if args.prompt is not None and args.prompt > args.ctx:
        raise BenchcalError(f"--prompt {args.prompt} does not fit the context of {args.ctx} tokens (--ctx)")
    return args.prompt or min(DEFAULT_PROMPT_TOKENS, args.ctx)


def cmd_predict(args) -> int:
    if args.concurrency and args.request_rate:
        raise BenchcalError("--concurrency and --request-rate describe two loads: give one of them")
    if args.server is not None and not (args.concurrency or args.request_rate):
        raise BenchcalError("--server names the server under a load: add --concurrency or --request-rate")
    check_server(normalize_engine(args.engine), args.server)
    args.prompt = prompt_tokens(args)
    if args.engine_build is not None:  # validated before the host probe or any prediction runs
        era_for_build(normalize_engine(args.engine), args.engine_build)
    table = _table(args)
    dev = resolve_gpu(args, table)
    scenario = scenario_from_args(args, dev)
    est = predict_scenario(scenario, table)
    report = predict_report(est, table)
    fit = table.serving_fit(serving_key(est.engine, scenario.server), dev.id) \
        if (args.concurrency or args.request_rate) else None
    if args.concurrency:
        load = predict_load(scenario, args.concurrency, args.output_tokens, coefficients=table, overheads=fit)
        add_load_section(report, load)
        if args.format == "html":  # the curves around the load asked for
            levels = sorted({2 ** k for k in range(0, 12) if 2 ** k <= max(16, 2 * args.concurrency)}
                            | {args.concurrency})
            report.charts += load_curve_charts([
                predict_load(scenario, c, args.output_tokens, coefficients=table, overheads=fit) for c in levels])
    if args.request_rate:
        rate = predict_rate(scenario, args.request_rate, args.output_tokens, coefficients=table, overheads=fit)
        add_rate_section(report, rate)
        if args.format == "html":  # from a tenth of the capacity to just under it, and the rate asked for
            capacity = rate["capacity_requests_per_s"]
            rates = sorted({round(capacity * f, 4) for f in (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95)}
                           | ({args.request_rate} if args.request_rate < capacity else set()))
            report.charts += rate_curve_charts([
                predict_rate(scenario, r, args.output_tokens, coefficients=table, overheads=fit) for r in rates])
    emit(render(report, args.format), args)
    return 0


def cmd_leaderboard(args) -> int:
    engine = normalize_engine(args.engine)
    arch = require_context(resolve_model(args.model), args.ctx)
    rep = leaderboard_report(arch, args.quant or default_format(arch, engine),
                             args.ctx, engine, table=_table(args),
                             prompt_tokens=positive("--prompt", args.prompt), kv_dtype=args.kv_dtype,
                             batch=positive("--batch", args.batch))
    emit(render(rep, args.format), args)
    return 0


def cmd_matrix(args) -> int:
    engine = normalize_engine(args.engine)
    arch = resolve_model(args.model)
    contexts = None
    if args.contexts is not None:
        try:
            contexts = [int(x) for x in args.contexts.split(",")]
        except ValueError:
            raise BenchcalError(f"--contexts takes comma-separated positive integers, got '{args.contexts}'") from None
        for c in contexts:
            if c <= 0:
                raise BenchcalError(f"--contexts takes comma-separated positive integers, got '{args.contexts}'")
        arch = require_context(arch, max(contexts))
    rep = matrix_report(arch, resolve_gpu(args), engine, contexts=contexts, table=_table(args),
                        device_count=positive("--gpus", args.gpus), kv_dtype=args.kv_dtype)
    emit(render(rep, args.format), args)
    return 0


def cmd_recommend(args) -> int:
    engine = normalize_engine(args.engine)
    arch = require_context(resolve_model(args.model), args.ctx)
    if args.budget is not None:
        positive("--budget", args.budget)
    prompt = prompt_tokens(args)
    rep = recommend_report(arch, args.ctx, args.quant, engine, min_decode=args.min_decode or 0.0,
                           budget_usd=args.budget, table=_table(args), max_ttft_ms=args.max_ttft_ms,
                           max_tpot_ms=args.max_tpot_ms, output_tokens=args.output_tokens,
                           prompt_tokens=prompt, evidence=args.evidence)
    emit(render(rep, args.format), args)
    return 0


def cmd_models(args) -> int:
    if args.gpu is None:
        for flag in ("quant", "ctx", "engine", "prompt", "coefficients"):
            if getattr(args, flag) is not None:
                raise BenchcalError(f"--{flag} applies to the models on a device: give --gpu too")
        emit(render(catalogue_models_report(load_catalogue()), args.format), args)
        return 0
    from benchcal.reports.device_models import device_models_report

    engine = normalize_engine(args.engine or "llama.cpp")
    ctx = args.ctx or 8192
    table = load_coefficients(args.coefficients) if args.coefficients else default_coefficients()
    dev = resolve_gpu(args, table)
    if args.quant is not None:
        from predictor.quants import resolve_quant

        resolve_quant(args.quant, engine)  # refused before anything is predicted
    rep = device_models_report(load_catalogue(), dev, engine, ctx, args.quant, prompt_tokens=args.prompt or 4096,
                               table=table)
    emit(render(rep, args.format), args)
    return 0


def cmd_gpus(args) -> int:
    emit(render(catalogue_devices_report(load_devices()), args.format), args)
    return 0


def register(sub) -> None:
    p = sub.add_parser("predict", help="memory breakdown, fit verdict, decode/prefill/TTFT, launch commands",
                       formatter_class=RAW, epilog="example:\n  benchcal predict --model qwen2.5-72b --gpu l4 "
                       "--quant Q4_K_M --ctx 8192\n  benchcal predict --model qwen2.5-72b --gpu h200 --ctx 32768 "
                       "--format json")
    _add_common(p)
    p.add_argument("--prompt", type=positive_int, default=None, help="prompt length for TTFT, tokens (default 4096, or the context when shorter)")
    p.add_argument("--prompt-depth", type=non_negative_int, default=0, help="tokens already in the KV cache when the "
                   "prompt arrives (a conversation's earlier turns; llama-bench's -d): its prefill attends to them too "
                   "(default 0; depth + prompt must fit --ctx)")
    p.add_argument("--batch", type=positive_int, default=1, help="concurrent sequences (default 1)")
    p.add_argument("--kv-dtype", default=None, help="f16, bf16, q8_0, q4_0 (llama.cpp); bf16, fp8 (vLLM)")
    p.add_argument("--gpus", type=positive_int, default=1, help="number of devices (tensor parallel for vLLM, at a size "
                   "that divides the model's attention heads; layer split for llama.cpp)")
    p.add_argument("--offload", type=fraction, default=0.0, help="fraction of layers kept in host RAM (0-1)")
    p.add_argument("--no-flash-attn", action="store_true", help="predict with flash attention off")
    p.add_argument("--n-ubatch", type=positive_int, default=512, help="llama.cpp physical batch (default 512)")
    p.add_argument("--backend", default=None, help="llama.cpp backend: CUDA, ROCm, Vulkan, Metal, SYCL, CPU (default: "
                   "the device vendor's: CUDA on NVIDIA, ROCm on AMD, Metal on Apple, SYCL on Intel)")
    p.add_argument("--host-bw-gbs", type=positive_float, default=None, help="host RAM bandwidth for offloaded layers, GB/s")
    p.add_argument("--host-mem-gib", type=positive_float, default=None, help="host RAM available for offload, GiB (default 64)")
    p.add_argument("--engine-build", default=None, help="engine build to predict for: a llama.cpp build number "
                   "(7474 or b7474) or a vLLM version; its era's fitted values are used (default: the newest era "
                   "with data; eras in predictor/data/engine_eras.json); a vLLM version before 0.21 sizes its KV pool "
                   "without the CUDA graphs")
    p.add_argument("--gpu-memory-utilization", type=share, default=None, help="vLLM: share of each GPU it may use, "
                   "its KV pool being what is left after weights and runtime (default 0.92, as vllm serve)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="vLLM: the most sequences a batch holds "
                   "(default vllm serve's on the device: 1024 on one of 70 GiB or more but an A100, else 256): caps the "
                   "running sequences and sizes the profile run's sampled logits")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None, help="vLLM: tokens one step may "
                   "take (default vllm serve's on the device: 16384 from 160 GiB, 8192 from 70 GiB but an A100, other GPUs "
                   "2048; 8192 on a CPU): the profile run's activation peak grows with it")
    p.add_argument("--vllm-sampler", choices=("pytorch", "flashinfer"), default="pytorch", help="vLLM on a GPU: the "
                   "top-k/top-p sampler its profile run warms up: pytorch (default: vLLM's own, which sorts the logits "
                   "and holds vllm_sampler_copies more logits-sized buffers) or flashinfer (FlashInfer's sort-free "
                   "kernel, the log line 'Using FlashInfer for top-p & top-k sampling': no sort buffers)")
    p.add_argument("--server", choices=SERVER_NAMES, default=None,
                   help="with --concurrency or --request-rate: the server under load (llama.cpp: llama-cpp-python, "
                   "the default, one request at a time, or llama-server, whose slots decode together, --max-num-seqs "
                   "of them, default 4; vLLM: vllm)")
    p.add_argument("--concurrency", type=positive_int, default=None, help="also predict the server under this many "
                   "requests in flight (--prompt-token prompts, --output-tokens each): throughput, TTFT, TPOT")
    p.add_argument("--request-rate", type=positive_float, default=None, help="also predict the server under Poisson "
                   "arrivals at this many requests per second: capacity, throughput, TTFT/TPOT/end-to-end mean, p50, "
                   "p90, p99 (simulated over 1,000 requests)")
    p.add_argument("--output-tokens", type=positive_int, default=256, help="with --concurrency or --request-rate: "
                   "tokens generated per request (default 256)")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("leaderboard", help="every device: status, total/usable, decode, TTFT, max safe context",
                       formatter_class=RAW, epilog="example:\n  benchcal leaderboard --model qwen2.5-72b --quant Q4_K_M "
                       "--ctx 32768")
    _add_common(p, gpu=False)
    p.add_argument("--prompt", type=positive_int, default=4096, help="prompt length for TTFT, tokens (default 4096)")
    p.add_argument("--batch", type=positive_int, default=1, help="concurrent sequences (default 1)")
    p.add_argument("--kv-dtype", default=None, help="KV cache type")
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("matrix", help="quantization x context matrix for one device", formatter_class=RAW,
                       epilog="example:\n  benchcal matrix --model qwen2.5-72b --gpu rtx-pro-6000")
    _add_common(p, quant=False, ctx=False)
    p.add_argument("--contexts", default=None, help="comma-separated contexts (default 4K..model maximum)")
    p.add_argument("--gpus", type=positive_int, default=1, help="number of devices")
    p.add_argument("--kv-dtype", default=None, help="KV cache type")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("recommend", help="cheapest GPU, unified memory and rig that fit, best value, fastest, cloud",
                       formatter_class=RAW, epilog="example:\n  benchcal recommend --model qwen2.5-72b --ctx 32768 "
                       "--min-decode 20 --budget 10000")
    _add_common(p, gpu=False)
    p.add_argument("--min-decode", type=non_negative_float, default=None, help="minimum decode speed, tok/s")
    p.add_argument("--budget", type=positive_float, default=None, help="maximum purchase price, USD")
    p.add_argument("--prompt", type=positive_int, default=None, help="prompt length for TTFT, tokens (default 4096, "
                   "or the context when shorter)")
    p.add_argument("--max-ttft-ms", type=positive_float, default=None, help="serving target: also list, per device, "
                   "the most requests in flight whose time to first token stays within this many ms, and the cost per "
                   "1M output tokens at that load")
    p.add_argument("--max-tpot-ms", type=positive_float, default=None, help="serving target: time per output token, ms")
    p.add_argument("--output-tokens", type=positive_int, default=256, help="with a serving target: tokens generated "
                   "per request (default 256)")
    p.add_argument("--evidence", choices=("measured", "family", "prior", "any"), default="any",
                   help="only devices whose prediction has this evidence or better: measured (runs of the device, "
                   "engine, backend and format family in the fit), family, prior (the physics prior), any "
                   "(default; extrapolated too)")
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("models", help="list the model catalogue; with --gpu, every model on that device", formatter_class=RAW,
                       epilog="examples:\n  benchcal models --format md\n  benchcal models --gpu rtx-4090 --ctx 8192"
                       "\n  benchcal models --gpu h100-sxm --engine vllm --format json")
    p.add_argument("--gpu", default=None, help="device id or NVML name, or cpu: predict every catalogue model on it "
                   "(status, total / usable GiB, decode, TTFT, max safe context), fits first, the largest first")
    p.add_argument("--quant", default=None, help="with --gpu: one format for every model (default: each model's own "
                   "GGUF format, else Q4_K_M for llama.cpp / BF16 for vLLM)")
    p.add_argument("--ctx", type=positive_int, default=None, help="with --gpu: context, tokens (default 8192; capped "
                   "at each model's maximum)")
    p.add_argument("--engine", default=None, help="with --gpu: llama.cpp or vllm (default llama.cpp)")
    p.add_argument("--prompt", type=positive_int, default=None, help="with --gpu: prompt length for TTFT (default "
                   "4096, or the context when shorter)")
    p.add_argument("--coefficients", default=None, help="with --gpu: coefficients.json (default: the shipped table, "
                   "with your own fit's devices over it)")
    p.add_argument("--cpu-bw-gbs", type=positive_float, default=None, help="with --gpu cpu: host memory bandwidth, GB/s")
    p.add_argument("--cpu-tflops", type=positive_float, default=None, help="with --gpu cpu: host matmul rate, TFLOPS")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--output", "-o", type=output_file, default=None)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("gpus", help="list the device catalogue", formatter_class=RAW,
                       epilog="example:\n  benchcal gpus --format json")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--output", "-o", type=output_file, default=None)
    p.set_defaults(func=cmd_gpus)
