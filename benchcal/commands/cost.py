"""``benchcal cost``: cost per 1M output tokens, the cloud comparison, rent vs buy and serverless API prices."""

from __future__ import annotations

import argparse

from benchcal.argtypes import non_negative_float, output_file, positive_float, positive_int
from benchcal.commands.predict import _table, emit
from benchcal.reports.cost import cost_report
from benchcal.reports.render import FORMATS, render
from predictor.devices import resolve_device
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import default_format, normalize_engine
from predictor.scenario import require_context


def cmd_cost(args) -> int:
    engine = normalize_engine(args.engine)
    if args.hours_per_day > 24:
        raise BenchcalError(f"--hours-per-day is at most 24, got {args.hours_per_day:g}")
    if args.prompt > args.ctx:
        raise BenchcalError(f"--prompt {args.prompt} does not fit the context of {args.ctx} tokens (--ctx)")
    arch = require_context(resolve_model(args.model), args.ctx)
    device = None
    if args.gpu:
        if args.gpu.strip().lower() == "cpu":
            raise BenchcalError("--gpu cpu: costs are per rented or bought GPU; give a device id (l4, h100-sxm)")
        device = resolve_device(args.gpu)
    rep = cost_report(arch, args.quant or default_format(arch, engine), args.ctx, engine, table=_table(args),
                      device=device, concurrency=args.concurrency, output_tokens=args.output_tokens,
                      prompt_tokens=args.prompt, hours_per_day=args.hours_per_day, usd_per_kwh=args.usd_per_kwh,
                      input_tokens_per_output=args.input_per_output)
    emit(render(rep, args.format), args)
    return 0


def register(sub) -> None:
    p = sub.add_parser("cost", help="cost per 1M tokens, cloud comparison, rent vs buy, serverless API prices",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  benchcal cost --model llama-3.1-8b --gpu rtx-4090\n"
                              "  benchcal cost --model llama-3.3-70b --gpu h100-sxm --engine vllm --quant FP8 "
                              "--concurrency 16 --format json")
    p.add_argument("--model", required=True, help="catalogue id, HF id, config.json, HF dir or .gguf")
    p.add_argument("--gpu", default=None, help="device to cost in detail (rent vs buy); without it, the cloud "
                   "comparison only")
    p.add_argument("--quant", default=None, help="weights format (default: the format the release ships in where the engine "
                   "runs it, gpt-oss's MXFP4; else Q4_K_M for llama.cpp, BF16 for vLLM)")
    p.add_argument("--ctx", type=positive_int, default=8192, help="context length in tokens (default 8192)")
    p.add_argument("--engine", default="llama.cpp", help="llama.cpp or vllm (default llama.cpp)")
    p.add_argument("--prompt", type=positive_int, default=1024, help="prompt tokens per request (default 1024)")
    p.add_argument("--concurrency", type=positive_int, default=None, help="also cost the server at this many "
                   "requests in flight (the serving model's output tokens/s)")
    p.add_argument("--output-tokens", type=positive_int, default=256, help="with --concurrency: tokens generated per "
                   "request (default 256)")
    p.add_argument("--hours-per-day", type=positive_float, default=8.0, help="hours a day the GPU runs (default 8)")
    p.add_argument("--usd-per-kwh", type=non_negative_float, default=0.15, help="electricity price, $ per kWh "
                   "(default 0.15, an assumption: set yours)")
    p.add_argument("--input-per-output", type=non_negative_float, default=1.0, help="serverless API: input tokens "
                   "billed per output token (default 1)")
    p.add_argument("--coefficients", default=None, help="coefficients.json (default: the shipped table)")
    p.add_argument("--defaults", action="store_true", help="ignore calibrated coefficients; use engine defaults")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--output", "-o", type=output_file, default=None, help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_cost)
