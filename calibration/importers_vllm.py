"""Import vLLM's own benchmark files: ``vllm bench serve --save-result``, ``vllm bench latency --output-json``
and ``vllm bench throughput --output-json`` (and the older ``benchmarks/benchmark_*.py`` scripts, which
write the same keys).

- serve: one JSON object per run (``--append-result`` writes JSON lines). Its load (concurrency or request
  rate), throughputs and every latency statistic it has (mean, median, std, p50/p90/p99... of TTFT, TPOT, ITL
  and E2EL) are kept under ``measurements.serve``. TTFT and TPOT
  (``median_ttft_ms``, ``median_tpot_ms``, mean and std) become a prefill point (TTFT only) and a decode
  point (``1000 / TPOT`` tokens per second per sequence). The batch is ``max_concurrency``; without it
  (a request-rate run) it is estimated with Little's law, in-flight requests = request throughput x mean
  request latency, and the record says so (``batch_estimated``). A result that names several engine replicas
  behind one endpoint (llm-d's ``decode_replicas``) keeps their number (``replicas``): a record describes one GPU,
  whose batch is its share of the load. Calibration fits decode on batch-1 records only; the serving model's
  server terms are fitted on the ``serve`` figures (:mod:`calibration.serving`).
- latency: ``avg_latency`` and ``latencies`` (seconds) of whole requests; the file does not hold the
  input/output lengths or batch, so they are options. With ``--output-len 1`` the latency is a TTFT.
- throughput: ``tokens_per_second`` of an offline batch; stored for reports, not calibrated.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from calibration.import_schema import check_vllm_result
from calibration.importers import read_result_file, store_new_records
from harness import records
from predictor.devices import resolve_device
from predictor.errors import BenchcalError
from predictor.models import resolve_model
from predictor.quants import resolve_quant

_GPU_METADATA = re.compile(r"^(?:(\d+)\s*x\s*)?(.+)$", re.IGNORECASE)


def parse_vllm_results(text: str) -> list[dict[str, Any]]:
    """The result objects of a vLLM benchmark file (one JSON object, a list, or JSON lines)."""
    try:
        data = json.loads(text)
        return list(data) if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        pass
    try:
        results = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise BenchcalError(f"not a vLLM benchmark result file (JSON or JSON lines): {exc}") from None
    if not results:
        raise BenchcalError("an empty file: no vLLM benchmark result in it")
    return results


def result_kind(result: dict[str, Any]) -> str:
    """serve, latency or throughput, from the keys vLLM writes."""
    if not isinstance(result, dict):
        raise BenchcalError(f"unrecognised vLLM result: expected a JSON object, got {type(result).__name__}")
    if "median_tpot_ms" in result or "mean_ttft_ms" in result:
        return "serve"
    if "avg_latency" in result or "latencies" in result:
        return "latency"
    if "tokens_per_second" in result or "requests_per_second" in result:
        return "throughput"
    raise BenchcalError("unrecognised vLLM result: expected serve (TTFT/TPOT), latency or throughput keys")


def _ms_summary(median: Any, mean: Any, std: Any, n: int, invert: bool = False) -> dict[str, Any] | None:
    """A summary from vLLM's aggregate statistics (no samples); ``invert``: ms per token -> tokens per second."""
    if median in (None, 0) and mean in (None, 0):
        return None

    def conv(v: Any) -> float | None:
        if v in (None, 0):
            return None
        return 1000.0 / float(v) if invert else float(v)

    return {"samples": [], "median": conv(median) or conv(mean), "mean": conv(mean) or conv(median),
            "stddev": None if invert or std is None else float(std), "p10": None, "p90": None, "n": int(n),
            "statistic": "vLLM's aggregate over requests" + ("; tokens/s = 1000 / TPOT ms" if invert else "")}


def _serve_lengths(result: dict[str, Any]) -> tuple[float, float]:
    completed = max(int(result.get("completed") or 0), 1)
    lens = result.get("input_lens")
    if isinstance(lens, list) and lens:
        input_len = statistics.fmean(float(x) for x in lens)
    else:
        input_len = float(result.get("total_input_tokens") or 0) / completed
    output_len = float(result.get("total_output_tokens") or 0) / completed
    return input_len, output_len


_STAT_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_SERVE_KEYS = ("request_rate", "burstiness", "max_concurrency", "num_prompts", "completed", "duration",
               "request_throughput", "output_throughput", "total_token_throughput", "total_input_tokens",
               "total_output_tokens")


def serve_figures(result: dict[str, Any]) -> dict[str, Any]:
    """What a ``vllm bench serve`` result says about the load: its level (``max_concurrency`` or
    ``request_rate``, ``inf`` kept as vLLM writes it), throughputs, and every latency statistic the file has
    (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2el_ms``: mean, median, std and each percentile, ``p99`` for
    ``p99_ttft_ms``), as the file gives them (the per-request samples are not in it)."""
    out: dict[str, Any] = {key: result.get(key) for key in _SERVE_KEYS if key in result}
    for key, value in result.items():
        match = _STAT_KEY.match(str(key))
        if match and isinstance(value, (int, float)):
            out.setdefault(f"{match.group(2)}_ms", {})[match.group(1)] = float(value)
    for old in ("p99_ttft_ms", "p99_tpot_ms"):  # the keys earlier imports kept
        if old in result:
            out[old] = result[old]
    replicas = serve_replicas(result)
    if replicas > 1:
        out["replicas"] = replicas
    return out


def serve_replicas(result: dict[str, Any]) -> int:
    """How many engine replicas shared the load: llm-d's benchmark metadata ``decode_replicas`` (each replica a
    whole model on its own GPU behind a gateway), else 1."""
    try:
        return max(int(result.get("decode_replicas") or 1), 1)
    except (TypeError, ValueError):
        return 1


def serve_batch(result: dict[str, Any]) -> tuple[int, bool]:
    """(batch, estimated) of one replica (:func:`serve_replicas`): ``max_concurrency``, else Little's law from
    throughput and mean latency."""
    if result.get("max_concurrency"):
        return max(round(int(result["max_concurrency"]) / serve_replicas(result)), 1), False
    _input_len, output_len = _serve_lengths(result)
    latency_ms = result.get("mean_e2el_ms")
    if latency_ms is None and result.get("mean_ttft_ms") is not None:
        latency_ms = float(result["mean_ttft_ms"]) + float(result.get("mean_tpot_ms") or 0) * max(output_len - 1, 0)
    rate = float(result.get("request_throughput") or 0) / serve_replicas(result)
    if not latency_ms or not rate:
        return 1, True
    return max(1, round(rate * float(latency_ms) / 1000.0)), True


def _device(gpu: str | None, result: dict[str, Any]) -> str:
    name = gpu
    if not name and isinstance(result.get("gpu"), str):
        match = _GPU_METADATA.match(result["gpu"].replace("_", " ").strip())
        name = match.group(2) if match else None
    if not name:
        raise BenchcalError("cannot tell the GPU from the file; pass --gpu")
    return resolve_device(name).id


def vllm_record(result: dict[str, Any], *, model: str, device: str, quant: str, file_name: str,
                source_url: str | None, import_key: str, gpu_count: int = 1, input_len: int | None = None,
                output_len: int | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """A run record for one vLLM result object."""
    kind = result_kind(result)
    extra: dict[str, Any] = {}
    measurements: dict[str, Any] = {}
    if kind == "serve":
        n_in, n_out = _serve_lengths(result)
        batch, estimated = serve_batch(result)
        extra["batch_estimated"] = estimated
        n = int(result.get("completed") or 0)
        ttft = _ms_summary(result.get("median_ttft_ms"), result.get("mean_ttft_ms"), result.get("std_ttft_ms"), n)
        tpot = _ms_summary(result.get("median_tpot_ms"), result.get("mean_tpot_ms"), None, n, invert=True)
        if ttft:
            measurements["prefill"] = [{"prompt_tokens": round(n_in), "ttft_ms": ttft}]
        if tpot:
            measurements["decode"] = {"gen_tokens": round(n_out), "context_at_start": round(n_in), "decode_tok_s": tpot}
        measurements["serve"] = serve_figures(result)
    else:
        if not (input_len and output_len):
            raise BenchcalError(f"a vLLM {kind} result does not record its lengths: pass --input-len and --output-len")
        n_in, n_out, batch = float(input_len), float(output_len), int(batch_size or 1)
        if kind == "latency":
            latencies = [float(x) for x in result.get("latencies") or []] or [float(result["avg_latency"])]
            measurements["latency_ms"] = records.summarize(x * 1000.0 for x in latencies)
            if int(output_len) == 1:
                measurements["prefill"] = [{"prompt_tokens": int(input_len), "ttft_ms": measurements["latency_ms"]}]
        else:
            measurements["throughput_tok_s"] = result.get("tokens_per_second")
            measurements["requests_per_second"] = result.get("requests_per_second")
    config = {
        "model": model, "quant": quant, "engine": "vllm", "device": device, "weights": "imported",
        "device_count": int(gpu_count or 1), "context": int(round(n_in + n_out)), "batch": int(batch),
        "kv_dtype": "bf16", "prompt_tokens": [round(n_in)] if n_in else [], "gen_tokens": round(n_out),
        "reps": 1, "warmup": 0, "engine_options": {},
    }
    provenance = {
        "source": "imported", "imported_from": file_name, "import_format": f"vllm bench {kind}",
        "source_url": source_url, "import_key": import_key, "engine_version": None,
        "device_name": result.get("gpu"), "model_id": result.get("model_id"), "started_at": result.get("date"),
    }
    return records.new_record(config, measurements=measurements, provenance=provenance,
                              prediction_reason="imported result; benchcal report recomputes predictions", **extra)


def import_vllm_bench(path: str | Path, *, model: str, runs_dir: str | Path, gpu: str | None = None,
                      quant: str = "BF16", source_url: str | None = None, gpu_count: int = 1,
                      input_len: int | None = None, output_len: int | None = None,
                      batch_size: int | None = None) -> tuple[list[Path], list[str]]:
    """Import one vLLM benchmark file; returns (paths written, messages)."""
    file, text = read_result_file(path)
    results = parse_vllm_results(text)
    model_id = resolve_model(model).id
    quant_id = resolve_quant(quant, "vllm").id
    for i, result in enumerate(results):
        check_vllm_result(result, result_kind(result), file.name, i)

    def build(i: int, result: dict[str, Any], key: str) -> tuple[dict[str, Any], str | None]:
        record = vllm_record(result, model=model_id, device=_device(gpu, result), quant=quant_id, file_name=file.name,
                             source_url=source_url, import_key=key, gpu_count=gpu_count, input_len=input_len,
                             output_len=output_len, batch_size=batch_size)
        message = None
        if record.get("batch_estimated"):
            message = (f"no max_concurrency; batch {record['config']['batch']} estimated "
                       "with Little's law (not used to fit batch-1 decode)")
        return record, message

    return store_new_records(text, results, runs_dir, "result", build)
