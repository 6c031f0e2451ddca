"""Import GuideLLM's result files (``guidellm benchmark --output-path results.json``, the ``benchmarks`` report of
GuideLLM 0.3, the release the tests' reports come from): one record per benchmark, i.e. per load level of the run.
Later releases moved the request totals and the strategy elsewhere in the report; such a file is refused in one
line (no ``args.strategy``), not misread.

GuideLLM drives any OpenAI-compatible server, so the engine is an option (vLLM by default) and the device too (the
file names neither). Each benchmark becomes the record a ``vllm bench serve`` result would
(:func:`calibration.importers_vllm.vllm_record`): its load (``concurrent`` streams or ``synchronous``: the batch is
that many requests in flight; ``constant`` / ``poisson`` rates: the request rate, and the batch from Little's law,
marked estimated), its throughputs and every latency statistic the file has, mean, median, standard deviation and
percentiles (p50, p90, p95, p99...), of successful requests. The latencies are GuideLLM's, with vLLM's names:

- TTFT: ``time_to_first_token_ms``, from the request's start to its first token (as vLLM's).
- TPOT: ``inter_token_latency_ms``, per request ``(last token - first token) / (output tokens - 1)`` (GuideLLM's
  ``GenerativeTextResponseStats.inter_token_latency_ms``), which is vLLM's TPOT (time per output token after the
  first); GuideLLM's own ``time_per_output_token_ms`` (the same span over all output tokens) is kept as
  ``guidellm_tpot_ms``.
- E2EL: ``request_latency`` (seconds), from the request's start to its end.

GuideLLM keeps no ITL per token pair, so there is no ``itl_ms``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calibration.importers import read_result_file, store_new_records
from calibration.importers_vllm import vllm_record
from predictor.devices import resolve_device
from predictor.engines import traits
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import normalize_engine, resolve_quant

IMPORT_FORMAT = "guidellm benchmark"
_RATE_TYPES = ("constant", "poisson")
_STREAM_TYPES = ("concurrent", "synchronous")
_LATENCIES = (("ttft", "time_to_first_token_ms", 1.0), ("tpot", "inter_token_latency_ms", 1.0),
              ("e2el", "request_latency", 1000.0))


def parse_guidellm(text: str) -> list[dict[str, Any]]:
    """The ``benchmarks`` of a GuideLLM report (a JSON object with that list)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchcalError(f"not a GuideLLM result file (JSON): {exc}") from None
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise BenchcalError("not a GuideLLM result file: no 'benchmarks' list (guidellm benchmark --output-path "
                            "FILE.json writes one)")
    return benchmarks


def _successful(benchmark: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = ((benchmark.get("metrics") or {}).get(name) or {}).get("successful")
    return value if isinstance(value, dict) and value.get("count") else None


def _strategy(benchmark: dict[str, Any], i: int) -> dict[str, Any]:
    strategy = (benchmark.get("args") or {}).get("strategy")
    if not isinstance(strategy, dict) or not strategy.get("type_"):
        raise BenchcalError(f"benchmark {i + 1}: no args.strategy.type_ (not a GuideLLM 0.3 benchmark report)")
    return strategy


def as_serve_result(benchmark: dict[str, Any], i: int) -> dict[str, Any]:
    """One benchmark as the keys of a ``vllm bench serve`` result (see the module docstring)."""
    strategy = _strategy(benchmark, i)
    kind = str(strategy["type_"])
    if kind not in _STREAM_TYPES + _RATE_TYPES:
        raise BenchcalError(f"benchmark {i + 1}: a '{kind}' load (GuideLLM's throughput / async sweeps send "
                            "requests without a fixed concurrency or rate): nothing to calibrate")
    totals = benchmark.get("request_totals") or {}
    completed = int(totals.get("successful") or 0)
    prompts, outputs = _successful(benchmark, "prompt_token_count"), _successful(benchmark, "output_token_count")
    if not completed or not prompts or not outputs:
        raise BenchcalError(f"benchmark {i + 1}: no successful request with token counts")
    result: dict[str, Any] = {
        "completed": completed, "num_prompts": int(totals.get("total") or completed),
        "total_input_tokens": float(prompts["total_sum"]), "total_output_tokens": float(outputs["total_sum"]),
        "model_id": (benchmark.get("worker") or {}).get("backend_model"), "guidellm_strategy": kind,
    }
    if kind == "synchronous":
        result["max_concurrency"] = 1
    elif kind == "concurrent":
        result["max_concurrency"] = int(strategy["streams"])
    else:
        result["request_rate"] = float(strategy["rate"])
    if benchmark.get("duration"):
        result["duration"] = float(benchmark["duration"])
    rate = _successful(benchmark, "requests_per_second")
    if rate:
        result["request_throughput"] = float(rate["mean"])
    out_rate = _successful(benchmark, "output_tokens_per_second")
    if out_rate:
        result["output_throughput"] = float(out_rate["mean"])
    for short, name, scale in _LATENCIES:
        stats = _successful(benchmark, name)
        if not stats:
            continue
        result[f"mean_{short}_ms"] = float(stats["mean"]) * scale
        result[f"median_{short}_ms"] = float(stats["median"]) * scale
        result[f"std_{short}_ms"] = float(stats["std_dev"]) * scale
        for p, value in (stats.get("percentiles") or {}).items():
            if value is not None and str(p).startswith("p") and str(p)[1:].isdigit() and len(str(p)) <= 3:
                result[f"{p}_{short}_ms"] = float(value) * scale
    if "median_ttft_ms" not in result or "median_tpot_ms" not in result:
        raise BenchcalError(f"benchmark {i + 1}: no time_to_first_token_ms or inter_token_latency_ms statistics")
    own = _successful(benchmark, "time_per_output_token_ms")
    if own:
        result["guidellm_tpot_ms"] = {"mean": float(own["mean"]), "median": float(own["median"])}
    return result


def import_guidellm(path: str | Path, *, model: str, runs_dir: str | Path, gpu: str, engine: str = "vllm",
                    quant: str = "BF16", source_url: str | None = None,
                    gpu_count: int = 1) -> tuple[list[Path], list[str]]:
    """Import one GuideLLM report; returns (paths written, messages). Every benchmark is checked before any record
    is written."""
    if not gpu:
        raise BenchcalError("a GuideLLM report does not name the device: pass --gpu")
    file, text = read_result_file(path)
    benchmarks = parse_guidellm(text)
    engine_id = normalize_engine(engine)
    model_id = resolve_model(model).id
    quant_id = resolve_quant(quant, engine_id).id
    device = resolve_device(gpu).id
    results = [as_serve_result(b, i) for i, b in enumerate(benchmarks)]

    def build(i: int, result: dict[str, Any], key: str) -> tuple[dict[str, Any], str | None]:
        record = vllm_record(result, model=model_id, device=device, quant=quant_id, file_name=file.name,
                             source_url=source_url, import_key=key, gpu_count=gpu_count)
        record["config"]["engine"] = engine_id
        record["config"]["kv_dtype"] = traits(engine_id).default_kv_dtype  # the server's default cache type
        record["measurements"]["serve"]["guidellm_strategy"] = result["guidellm_strategy"]
        if "guidellm_tpot_ms" in result:
            record["measurements"]["serve"]["guidellm_tpot_ms"] = result["guidellm_tpot_ms"]
        record["provenance"]["import_format"] = IMPORT_FORMAT
        message = None
        if record.get("batch_estimated"):
            message = (f"a {result['guidellm_strategy']} load at {result['request_rate']:g} requests/s; batch "
                       f"{record['config']['batch']} estimated with Little's law (not used to fit batch-1 decode)")
        return record, message

    return store_new_records(text, results, runs_dir, "benchmark", build)
