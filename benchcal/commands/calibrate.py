"""Calibration commands: calibrate, report, check, import (llama-bench, llama-log, vllm-bench, guidellm, vllm-log)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchcal.argtypes import non_negative_int, output_dir, output_file
from benchcal.reports.render import FORMATS
from predictor.errors import BenchcalError, positive

RAW = argparse.RawDescriptionHelpFormatter
PACKAGE_DIR = Path(__file__).resolve().parents[2] / "calibration"


def _runs_dirs(args, default: str | None = None) -> list[str]:
    """The runs directories named, else ``default``, else the user's (``$BENCHCAL_HOME/runs``)."""
    from harness.records import runs_dir

    return [str(d) for d in (args.runs_dir or [default or runs_dir(None)])]


def _dataset(args, default_runs: str | None = None):
    from calibration.dataset import load_dataset

    dirs = _runs_dirs(args, default_runs)
    dataset = load_dataset(dirs)
    if len(dataset.observations.runs) == 0:
        raise BenchcalError(f"no run records under {', '.join(dirs)} (measure with `benchcal bench` or "
                            "`benchcal import`)")
    return dataset, dirs


def _table(path: str | None, shipped_only: bool = False):
    """``--coefficients``: a file, ``defaults`` (engine defaults), else the shipped table with the user's device
    scopes over it (``shipped_only``: the shipped table alone, as the accuracy gate reads it)."""
    from predictor.coefficients import (
        Coefficients,
        default_coefficients,
        default_coefficients_path,
        load_coefficients,
    )

    if path is not None and path.lower() == "defaults":
        return Coefficients()
    if path is not None:
        return load_coefficients(path)
    return load_coefficients(default_coefficients_path()) if shipped_only else default_coefficients()


def _prior(choice: str, dirs: list[str]):
    """The table a fit starts from: ``none`` (engine defaults), ``shipped``, a file; ``auto`` is none for the
    shipped runs (the shipped table is fitted from scratch) and the shipped table for anyone else's."""
    from predictor.coefficients import default_coefficients_path, load_coefficients
    from predictor.userdata import is_shipped

    if choice == "auto":
        choice = "none" if all(is_shipped(d) for d in dirs) else "shipped"
    if choice == "none":
        return None
    return load_coefficients(default_coefficients_path() if choice == "shipped" else choice)


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text, encoding="utf-8")
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _serving(dirs: list[str], table: dict) -> dict:
    """The serving model's fit over the runs' serving runs, against the freshly fitted table; printed."""
    from calibration.serving import fit_serving
    from predictor.coefficients import Coefficients

    fits = fit_serving(dirs, Coefficients(table))
    for engine, devices in fits.items():
        for device, fit in devices.items():
            rated = bool(fit.get("request_rates_fitted"))
            checks = fit.get("request_rates_held_out", []) if rated else fit["held_out"]
            held = [c for c in checks if c["output_tok_s"]["error"] is not None]
            what = "each request rate" if rated else "highest concurrency"
            worst = (f"; held-out {what}: output tok/s {max(abs(c['output_tok_s']['error']) for c in held):.1%}"
                     f", TTFT p50 {max(abs(c['ttft_p50_ms']['error'] or 0) for c in held):.1%} worst") if held else ""
            load = (f"request rates {fit['request_rates_fitted']}"
                    if rated else f"concurrency {fit['concurrency']}")
            print(f"serving {engine} on {device}: {fit['source']} ({load}){worst}")
    return fits


def cmd_calibrate(args) -> int:
    from calibration.crossval import annotate, cross_validate
    from calibration.kvpool import gpu_kv_pool_checks, gpu_pool_summary, kv_pool_checks
    from calibration.output import write_table
    from calibration.table import fit_table
    from predictor.coefficients import Coefficients
    from predictor.userdata import user_calibration_dir

    dataset, dirs = _dataset(args)
    if not any(block.fittable.any() for block in dataset.blocks.values()):
        raise BenchcalError(f"no usable measurements under {', '.join(dirs)} (only failed or incomplete runs)")
    prior = _prior(args.prior, dirs)
    out = args.out or str(user_calibration_dir())
    source = f"benchcal calibrate --runs-dir {' '.join(dirs)}" + (f" (prior: {prior.source})" if prior else "")
    table = fit_table(dataset, n_boot=args.bootstrap, source=source, prior=prior)
    table = annotate(table, dataset, cross_validate(dataset, table, prior))
    serving = _serving(dirs, table)
    if serving:
        table["serving"] = serving
    pools = kv_pool_checks(dataset)
    if pools:
        table["vllm_cpu_kv_pool_checks"] = pools
    for check in pools:
        print(f"vLLM KV pool on {check['device']}, {check['model']}: logged {check['logged_gib']:.2f} GiB, predicted "
              f"{check['in_sample_gib']:.2f} in-sample ({check['in_sample_error']:+.1%}), {check['held_out_gib']:.2f} "
              f"held out ({check['held_out_error']:+.1%}; worker from {check['held_out_from']})")
    gpu_pools = gpu_kv_pool_checks(dirs, Coefficients(table))
    if gpu_pools:
        table["vllm_gpu_kv_pool_checks"] = {"summary": gpu_pool_summary(gpu_pools), "logs": gpu_pools}
        summary = table["vllm_gpu_kv_pool_checks"]["summary"]
        print(f"vLLM KV pool on GPUs, {summary['n']} imported logs (none fitted): median |error| "
              f"{summary['median_abs_error']:.1%}, mean {summary['mean_abs_error']:.1%}, "
              f"max {summary['max_abs_error']:.1%}, within 5%: {summary['within_5_percent']} of {summary['n']}"
              if summary["n"] else "vLLM KV pool on GPUs: no scored log")
    for path in write_table(table, out, dirs):
        print(f"wrote {path}")
    metrics = table.get("cross_validation") or {}
    for name, label in (("in_sample", "in-sample"), ("lomo", "leave-one-model-out"), ("lodo", "leave-one-device-out"),
                        ("lofo", "leave-one-family-out"), ("loso", "leave-one-source-out")):
        overall = (metrics.get(name) or {}).get("overall") or {}
        parts = [f"{q} MAPE {100 * m['mape']:.1f}% (n={m['n']})" for q, m in overall.items() if m.get("n")]
        print(f"{label}: " + ("; ".join(parts) if parts else "not enough data"))
    imported = ((metrics.get("loso") or {}).get("origins") or {}).get("imported") or {}
    parts = [f"{q} MAPE {100 * m['mape']:.1f}% (n={m['n']})" for q, m in imported.items() if m.get("n")]
    if parts:
        print("leave-one-source-out, imported public results: " + "; ".join(parts))
    return 0


def cmd_report(args) -> int:
    from benchcal.reports.calibration import add_serving_section, build_report
    from benchcal.reports.render import Report, render
    from calibration.dataset import load_dataset

    table = _table(args.coefficients)
    dirs = _runs_dirs(args, None)
    dataset = load_dataset(dirs)
    if len(dataset.observations.runs):
        report = build_report(dataset, table, charts=args.format == "html")
    else:  # serving runs only (they are not batch runs)
        report = Report(title="benchcal: measured vs predicted", subtitle=f"serving runs under {', '.join(dirs)}",
                        data={"schema": "benchcal.report/1", "coefficients": table.source})
    add_serving_section(report, dirs, table, charts=args.format == "html")
    if not report.sections:
        raise BenchcalError(f"no run records under {', '.join(dirs)} (measure with `benchcal bench` or "
                            "`benchcal import`)")
    _emit(render(report, args.format), args.output)
    return 0


def cmd_check(args) -> int:
    from calibration.check import baseline_document, load_baseline, load_thresholds, run_check, summary_lines

    thresholds = load_thresholds(args.thresholds)
    baseline_path = None if str(args.baseline).lower() == "none" else args.baseline
    from predictor.userdata import shipped_runs_dir

    table = _table(args.coefficients, shipped_only=True)
    dataset, dirs = _dataset(args, str(shipped_runs_dir()))
    from calibration.kvpool import gpu_kv_pool_checks

    result = run_check(dataset, table, thresholds, None if args.write_baseline else load_baseline(baseline_path),
                       include_noisy=args.include_noisy, gpu_pools=gpu_kv_pool_checks(dirs, table),
                       held_out=args.held_out)
    if args.write_baseline:
        if baseline_path is None:
            raise BenchcalError("--write-baseline needs a --baseline path")
        Path(baseline_path).write_text(json.dumps(baseline_document(result, table.source, dirs), indent=1) + "\n")
        print(f"wrote {baseline_path}")
    print(f"benchcal check: coefficients {table.source}; runs {', '.join(dirs)}")
    for line in summary_lines(result):
        print(line)
    for note in result.notes:
        print(f"note: {note}")
    if result.failures and not args.write_baseline:
        print(f"FAILED: {len(result.failures)} error(s) over threshold or worse than the baseline:")
        for failure in result.failures:
            print(f"  {failure}")
        return 1
    print("ok: every error within its threshold" + ("" if args.write_baseline else " and the baseline tolerance"))
    return 0


def _import_files(args, import_one) -> int:
    """Run ``import_one(file, runs_dir) -> (written, messages)`` over the files; report what was stored."""
    runs = args.runs_dir or str(Path(_runs_dirs(argparse.Namespace(runs_dir=None))[0]) / "imported")
    total = 0
    for file in args.files:
        written, messages = import_one(file, runs)
        total += len(written)
        for message in messages:
            print(f"{file}: {message}", file=sys.stderr)
    print(f"imported {total} record(s) into {runs}")
    return 0


def cmd_import_llama_bench(args) -> int:
    from calibration.importers import import_llama_bench

    return _import_files(args, lambda file, runs: import_llama_bench(
        file, model=args.model, runs_dir=runs, gpu=args.gpu, source_url=args.source_url, gpu_count=args.gpus))


def cmd_import_vllm_bench(args) -> int:
    from calibration.importers_vllm import import_vllm_bench

    return _import_files(args, lambda file, runs: import_vllm_bench(
        file, model=args.model, runs_dir=runs, gpu=args.gpu, quant=args.quant, source_url=args.source_url,
        gpu_count=args.gpus or 1, input_len=args.input_len, output_len=args.output_len, batch_size=args.batch_size))


def cmd_import_guidellm(args) -> int:
    from calibration.importers_guidellm import import_guidellm

    return _import_files(args, lambda file, runs: import_guidellm(
        file, model=args.model, runs_dir=runs, gpu=args.gpu, engine=args.engine, quant=args.quant,
        source_url=args.source_url, gpu_count=args.gpus or 1))


def cmd_import_llama_log(args) -> int:
    from calibration.importers_llama_log import import_llama_log

    return _import_files(args, lambda file, runs: import_llama_log(
        file, model=args.model, runs_dir=runs, gpu=args.gpu, source_url=args.source_url))


def cmd_import_vllm_log(args) -> int:
    from calibration.importers_vllm_log import import_vllm_log

    settings = {"gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": args.max_model_len,
                "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                "enforce_eager": True if args.enforce_eager else None, "kv_cache_dtype": args.kv_cache_dtype,
                "vllm_version": args.vllm_version}
    return _import_files(args, lambda file, runs: import_vllm_log(
        file, model=args.model, runs_dir=runs, gpu=args.gpu, quant=args.quant, source_url=args.source_url,
        **settings))


def cmd_import_missing_kind(args) -> int:
    raise BenchcalError("import needs a kind: llama-bench, llama-log, vllm-bench, guidellm or vllm-log (see benchcal "
                        "import --help)")


def _positive_int(text: str) -> int:
    try:
        return int(positive("value", int(text)))
    except (ValueError, BenchcalError):
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def register(sub) -> None:
    runs_help = ("directory of run records; repeat for several (default: your own runs, $BENCHCAL_RUNS or "
                 "$BENCHCAL_HOME/runs)")
    p = sub.add_parser("calibrate", help="fit coefficients from stored runs; write coefficients.{json,csv,md}",
                       formatter_class=RAW, epilog="examples:\n  benchcal calibrate                 # your runs -> "
                       "$BENCHCAL_HOME/calibration, which predict then uses for your devices\n"
                       "  benchcal calibrate --runs-dir runs --out calibration   # refit the shipped table")
    p.add_argument("--runs-dir", action="append", default=None, help=runs_help)
    p.add_argument("--out", type=output_dir, default=None, help="output directory (default: $BENCHCAL_HOME/calibration; the shipped "
                   "calibration/ only when named, as make refit does)")
    p.add_argument("--prior", default="auto", help="table the fit starts from and falls back to: auto (the shipped "
                   "table, or none when fitting the shipped runs), shipped, none, or a coefficients.json")
    p.add_argument("--bootstrap", type=non_negative_int, default=100, help="bootstrap resamples for uncertainties (default 100)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("report", help="measured vs predicted (engine defaults and calibrated) for every run",
                       formatter_class=RAW, epilog="example:\n  benchcal report --format html --output report.html")
    p.add_argument("--runs-dir", action="append", default=None, help=runs_help)
    p.add_argument("--coefficients", default=None, help="coefficients.json (default: the shipped "
                   "calibration/coefficients.json with your own fit's devices over it; 'defaults' for engine defaults)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--output", "-o", type=output_file, default=None, help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("check", help="accuracy gate: exit 1 when an error exceeds its threshold or the baseline",
                       formatter_class=RAW, epilog="example:\n  benchcal check --runs-dir runs\n"
                       "  benchcal check --runs-dir runs --held-out\n  benchcal check --runs-dir runs --write-baseline")
    p.add_argument("--runs-dir", action="append", default=None, help="directory of run records; repeat for several "
                   "(default: the shipped runs/)")
    p.add_argument("--coefficients", default=None, help="coefficients.json (default: calibration/coefficients.json)")
    p.add_argument("--thresholds", default=str(PACKAGE_DIR / "accuracy.toml"), help="thresholds TOML "
                   "(default: calibration/accuracy.toml)")
    p.add_argument("--baseline", default=str(PACKAGE_DIR / "baseline.json"), help="baseline JSON to compare with "
                   "(default: calibration/baseline.json; 'none' to skip)")
    p.add_argument("--write-baseline", action="store_true", help="write the current errors as the new baseline")
    p.add_argument("--include-noisy", action="store_true", help="also score measurements whose repetitions "
                   "spread more than 5%% (left out by default)")
    p.add_argument("--held-out", action="store_true", help="also predict the imported public results with each source "
                   "held out (a refit per source), pooled per engine, and fail above held_out_decode_mape / "
                   "held_out_prefill_mape (vLLM: held_out_vllm_decode_mape); "
                   "prints each source's fold and, not gated, each llama.cpp backend's and each architecture "
                   "class's (dense, MoE) held out in turn (about 30 s on 2 cores)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("import", help="import llama-bench, llama.cpp log, vLLM benchmark results or vLLM logs as run records",
                       formatter_class=RAW, epilog="examples:\n  benchcal import llama-bench results.json "
                       "--model llama-3.1-8b\n  benchcal import vllm-bench serve.json --model qwen2.5-7b --gpu h100-sxm")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", parser_class=type(p))
    for name, func, helptext in (("llama-bench", cmd_import_llama_bench, "llama-bench md/csv/json/jsonl output"),
                                 ("llama-log", cmd_import_llama_log, "llama-cli / llama-perplexity logs (their timing "
                                  "lines), as llama.cpp's CI keeps them"),
                                 ("vllm-bench", cmd_import_vllm_bench, "vllm bench serve/latency/throughput JSON"),
                                 ("guidellm", cmd_import_guidellm, "GuideLLM 0.3's benchmark report JSON (any "
                                  "OpenAI-compatible server): one record per load level"),
                                 ("vllm-log", cmd_import_vllm_log, "a vLLM server's start-up log on a GPU: the KV "
                                  "pool it sized, which benchcal calibrate checks the predicted pool against")):
        k = kinds.add_parser(name, help=helptext, formatter_class=RAW,
                             epilog=f"example:\n  benchcal import {name} FILE --model llama-3-8b --gpu rtx-4090")
        k.add_argument("files", nargs="+", metavar="FILE", help="result file(s)")
        k.add_argument("--model", required=True, help="catalogue model the results are for (e.g. llama-3-8b)")
        named = name in ("vllm-log", "guidellm")  # the file does not name the device
        k.add_argument("--gpu", required=named, default=None,
                       help="device id or name" + ("" if named else " (default: from the file)"))
        if name not in ("llama-log", "vllm-log"):
            k.add_argument("--gpus", type=_positive_int, default=None,
                           help="number of GPUs used (default 1, or the file's)")
        k.add_argument("--runs-dir", default=None, help="where records go (default: imported/ in your runs, "
                       "$BENCHCAL_HOME/runs/imported)")
        k.add_argument("--source-url", default=None, help="where the file was published (stored in provenance)")
        if name == "vllm-bench":
            k.add_argument("--quant", default="BF16", help="weight format served (default BF16)")
            k.add_argument("--input-len", type=_positive_int, default=None, help="prompt tokens (latency/throughput)")
            k.add_argument("--output-len", type=_positive_int, default=None, help="output tokens (latency/throughput)")
            k.add_argument("--batch-size", type=_positive_int, default=None, help="batch size (latency)")
        if name == "guidellm":
            k.add_argument("--engine", choices=("vllm", "llama.cpp"), default="vllm",
                           help="the server GuideLLM measured (default vllm)")
            k.add_argument("--quant", default="BF16", help="weight format served (default BF16)")
        if name == "vllm-log":
            k.add_argument("--quant", default="BF16", help="weight format served (default BF16)")
            unprinted = " (when the log does not print it)"
            k.add_argument("--gpu-memory-utilization", type=float, default=None, help="the run's" + unprinted)
            k.add_argument("--max-model-len", type=_positive_int, default=None, help="the run's" + unprinted)
            k.add_argument("--max-num-seqs", type=_positive_int, default=None,
                           help="the run's" + unprinted + "; default vLLM's on the device")
            k.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                           help="the run's" + unprinted + "; default vLLM's on the device")
            k.add_argument("--enforce-eager", action="store_true", help="the run had no CUDA graphs" + unprinted)
            k.add_argument("--kv-cache-dtype", default=None, help="the run's" + unprinted + "; default auto")
            k.add_argument("--vllm-version", default=None, help="the run's" + unprinted)
        k.set_defaults(func=func)
    p.set_defaults(func=cmd_import_missing_kind)
