"""The JSON Schemas of the result files ``benchcal import`` reads, checked with :mod:`harness.schemacheck`
before a record is built: a llama-bench row (its json field names; the markdown and csv forms are read into
those names first), a run of a llama.cpp log (llama-cli or llama-perplexity, as
:mod:`calibration.importers_llama_log` reads it) and each kind of vLLM benchmark result (serve, latency,
throughput).

The schemas hold what the records are built from: types, finiteness and ranges (token counts are whole numbers
of zero or more, speeds and times positive, a concurrency at least 1). Other keys pass: both tools write
many more than benchcal reads. A refusal is one line naming the file, the row and the field.
"""

from __future__ import annotations

from typing import Any

from harness.schemacheck import check

_COUNT = {"type": "integer", "minimum": 0}
_WHOLE = {"type": "integer", "minimum": 1}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_NON_NEGATIVE = {"type": "number", "minimum": 0}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_TEXT = {"type": ["string", "null"]}

LLAMA_BENCH_ROW_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "llama-bench result row (tools/llama-bench: json, jsonl, csv and markdown output)",
    "type": "object",
    "required": ["model_type", "n_prompt", "n_gen", "avg_ts"],
    "properties": {
        "model_type": {"type": "string", "minLength": 1},
        "n_prompt": _COUNT, "n_gen": _COUNT, "n_depth": _COUNT,
        "avg_ts": _POSITIVE, "stddev_ts": _nullable(_NON_NEGATIVE),
        "samples_ts": {"type": "array", "items": _POSITIVE},
        "model_size": _nullable(_WHOLE), "model_n_params": _nullable(_WHOLE),
        "n_batch": _nullable(_WHOLE), "n_ubatch": _nullable(_WHOLE), "n_threads": _nullable(_WHOLE),
        "n_gpu_layers": _nullable(_COUNT), "repetitions": _WHOLE, "n_devices": _nullable(_WHOLE),
        "build_number": _nullable(_COUNT), "build_commit": _TEXT,
        "type_k": _TEXT, "type_v": _TEXT, "gpu_info": _TEXT, "backends": _TEXT, "cpu_info": _TEXT,
        "model_filename": _TEXT, "test_time": _TEXT, "quantized_matmul": {"enum": ["cublas-fp16", None]},
        "flash_attn": {"type": ["boolean", "integer", "string", "null"]},
    },
}

# llama-bench's csv writes every field as text: these are read as numbers first (a cell that is not one stays
# text, and the schema names it).
_CSV_NUMBERS = tuple(k for k, v in LLAMA_BENCH_ROW_SCHEMA["properties"].items()
                     if ("integer" in str(v) or "number" in str(v)) and v.get("type") != "array")

_STATISTIC = "^(mean|median|std|p\\d+(\\.\\d+)?)_(ttft|tpot|itl|e2el)_ms$"
_RESULT_TEXT = {"date": _TEXT, "gpu": _TEXT, "model_id": _TEXT, "backend": _TEXT}

VLLM_RESULT_SCHEMAS: dict[str, dict[str, Any]] = {
    "serve": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "vllm bench serve --save-result (benchmarks/benchmark_serving.py)",
        "type": "object",
        "properties": {
            **_RESULT_TEXT,
            "request_rate": {"anyOf": [_POSITIVE, {"const": "inf"}, {"type": "null"}]},
            "burstiness": _nullable(_POSITIVE), "max_concurrency": _nullable(_WHOLE),
            "num_prompts": _nullable(_COUNT), "completed": _nullable(_COUNT), "duration": _nullable(_POSITIVE),
            "request_throughput": _nullable(_NON_NEGATIVE), "output_throughput": _nullable(_NON_NEGATIVE),
            "total_token_throughput": _nullable(_NON_NEGATIVE),
            "total_input_tokens": _nullable(_COUNT), "total_output_tokens": _nullable(_COUNT),
            "input_lens": {"type": "array", "items": _COUNT}, "output_lens": {"type": "array", "items": _COUNT},
        },
        "patternProperties": {_STATISTIC: _nullable(_NON_NEGATIVE)},
    },
    "latency": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "vllm bench latency --output-json (benchmarks/benchmark_latency.py)",
        "type": "object",
        "properties": {**_RESULT_TEXT, "avg_latency": _POSITIVE,
                       "latencies": {"type": "array", "items": _POSITIVE, "minItems": 1},
                       "percentiles": {"type": "object", "additionalProperties": _POSITIVE}},
        "anyOf": [{"required": ["avg_latency"]}, {"required": ["latencies"]}],
    },
    "throughput": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "vllm bench throughput --output-json (benchmarks/benchmark_throughput.py)",
        "type": "object",
        "properties": {**_RESULT_TEXT, "elapsed_time": _nullable(_POSITIVE), "num_requests": _nullable(_COUNT),
                       "total_num_tokens": _nullable(_COUNT), "requests_per_second": _nullable(_POSITIVE),
                       "tokens_per_second": _nullable(_POSITIVE)},
    },
}


LLAMA_LOG_RUN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "one llama-cli or llama-perplexity run of a llama.cpp log, as calibration.importers_llama_log reads it",
    "type": "object",
    "required": ["tool", "quant", "n_ctx", "n_batch", "n_ubatch"],
    "properties": {
        "tool": {"enum": ["llama-cli", "llama-perplexity"]},
        "quant": {"type": "string", "minLength": 1},
        "n_ctx": _WHOLE, "n_batch": _WHOLE, "n_ubatch": _WHOLE,
        "prompt_eval_ms": _POSITIVE, "prompt_tokens": _WHOLE, "eval_ms": _POSITIVE, "eval_runs": _WHOLE,
        "model_size_bytes": _nullable(_WHOLE), "model_params": _nullable(_WHOLE),
        "n_gpu_layers": _nullable(_COUNT), "threads": _nullable(_WHOLE), "build_number": _nullable(_COUNT),
        "build_commit": _TEXT, "device_name": _TEXT, "kv_dtype": _TEXT, "flash_attn": {"type": ["boolean", "null"]},
        "quantized_matmul": {"enum": ["cublas-fp16", None]},
        "backend": {"enum": ["CUDA", "ROCm", "Metal", "Vulkan", "SYCL", "CPU", None]},
    },
    "allOf": [
        {"if": {"properties": {"tool": {"const": "llama-perplexity"}}},
         "then": {"required": ["prompt_eval_ms", "prompt_tokens"]}},
        {"if": {"properties": {"tool": {"const": "llama-cli"}}}, "then": {"required": ["eval_ms", "eval_runs"]}},
    ],
}


def csv_row(row: dict[str, Any]) -> dict[str, Any]:
    """A llama-bench csv row with its numeric cells read as numbers (an empty cell is null)."""
    out = dict(row)
    if isinstance(out.get("samples_ts"), str):  # llama-bench writes the samples in json only
        out.pop("samples_ts")
    for key in _CSV_NUMBERS:
        cell = out.get(key)
        if not isinstance(cell, str):
            continue
        text = cell.strip()
        if not text:
            out[key] = None
            continue
        for cast in (int, float):
            try:
                out[key] = cast(text)
                break
            except ValueError:
                continue
    return out


def check_llama_bench_row(row: Any, file_name: str, index: int) -> None:
    check(row, LLAMA_BENCH_ROW_SCHEMA, f"{file_name}: row {index + 1}")


def check_llama_log_run(run: Any, file_name: str, index: int) -> None:
    check(run, LLAMA_LOG_RUN_SCHEMA, f"{file_name}: run {index + 1}")


def check_vllm_result(result: Any, kind: str, file_name: str, index: int) -> None:
    check(result, VLLM_RESULT_SCHEMAS[kind], f"{file_name}: result {index + 1}")
