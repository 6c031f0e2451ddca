"""The part of the vLLM engine that imports vLLM: runs in the harness's child process only.

:class:`VllmSession` builds vLLM's offline ``LLM`` for one run config and measures with it:

- prompts are token ids (``TokensPrompt``), the tokenizer is never loaded (``skip_tokenizer_init``), the
  prefix cache is off (``enable_prefix_caching=False``) and end-of-sequence is ignored;
- requests are driven through ``LLM.llm_engine.add_request`` / ``step()`` with delta outputs, so every
  generated token gets a ``time.perf_counter()`` timestamp in this process (``step_timestamps``); a step
  that returns several tokens of one sequence gives them one timestamp and is counted as coalesced;
- vLLM's own per-request timer (``RequestOutput.metrics``: ``RequestStateStats`` with engine-core
  ``scheduled_ts`` / ``first_token_ts`` / ``last_token_ts``, present when stats logging is on) is reported
  beside the wall clock; without it, decode time per token comes from two generations of different
  lengths (``two_lengths``);
- the KV pool is pinned with ``kv_cache_memory_bytes`` to what ``batch`` sequences of ``context`` tokens
  need (``kv_pool: pinned``, the default), or sized by vLLM's profiling from ``gpu_memory_utilization``
  (``kv_pool: profiled``), where on CPU the utilization is a fraction of host memory.

Code that builds an ``LLM`` must run in a ``__main__``-guarded entry point: vLLM starts worker processes.

Engine option ``api``: only ``"offline"`` (this module) is implemented. Measuring through ``vllm serve`` on
127.0.0.1 with a streaming client (``api: "serve"``) would add the OpenAI server's HTTP and detokenizer path
to every timestamp; it is not built yet and asking for it is an error rather than a silent fallback.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.engines.base import DecodeTiming, LoadInfo, PromptTiming, random_token_ids
from harness.engines.vllm.options import (
    INVENTORY_PREFIX,
    OPTIONS_PREFIX,
    QUANT_SETTINGS,
    default_engine_options,
    hf_text_config,
    kv_bytes_per_element,
    kv_cache_dtype,
    pinned_kv_cache_bytes,
    round_up_tokens,
    special_token_ids,
    vllm_environment,
)
from predictor.errors import BenchcalError

# Tokens per block used to size a pinned KV pool (vLLM's CPU backend uses 128-token blocks, GPUs 16).
KV_ROUNDING_TOKENS = 128


def module_inventory(model: Any) -> dict[str, int]:
    """Weight and KV-cache bytes held by ``model``'s modules (runs inside vLLM's worker via apply_model).

    Linear weights that the CPU backend repacked for oneDNN are left as empty parameters; they are
    counted at their logical size (``input_size_per_partition * output_size_per_partition``) in the
    parameter's dtype. Shared (tied) parameters are counted once.
    """
    seen: set[int] = set()
    weights_bytes = kv_bytes = packed = 0
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            elements = param.numel()
            rows = getattr(module, "output_size_per_partition", None)
            cols = getattr(module, "input_size_per_partition", None)
            if elements == 0 and name == "weight" and rows and cols:
                elements = int(rows) * int(cols)
                packed += 1
            weights_bytes += elements * param.element_size()
        cache = getattr(module, "kv_cache", None)
        tensors = cache if isinstance(cache, (list, tuple)) else [cache]
        for tensor in tensors:
            if hasattr(tensor, "untyped_storage") and id(tensor) not in seen:
                seen.add(id(tensor))
                kv_bytes += tensor.numel() * tensor.element_size()
    return {"weights_bytes": weights_bytes, "kv_cache_tensor_bytes": kv_bytes, "packed_weights": packed}


def _set_environment(options: Mapping[str, Any], on_cpu: bool) -> None:
    """Environment vLLM reads at import (:func:`harness.engines.vllm.options.vllm_environment`); the offline
    engine's module inventory goes to the worker by pickle (a reference to this module), which vLLM allows only
    with ``VLLM_ALLOW_INSECURE_SERIALIZATION``."""
    os.environ.update(vllm_environment(options, on_cpu, os.environ, pickled_rpc=True))


def _synthetic_overrides(config: Mapping[str, Any]) -> dict[str, int] | None:
    """Shrink overrides (num_layers, vocab_size) a run config carries for its synthetic model."""
    options = config.get("engine_options") or {}
    for value in (config.get("arch_overrides"), options.get("synthetic_overrides")):
        if isinstance(value, Mapping) and value:
            return {str(k): int(v) for k, v in value.items()}
    return None


def resolve_model_dir(config: Mapping[str, Any], weights_path: str | None) -> tuple[Path, str]:
    """The HF directory to load and its load format ("dummy" for a synthetic, config-only directory)."""
    from harness.synthetic_hf import is_synthetic_dir, synthetic_hf_dir

    if weights_path:
        path = Path(weights_path).expanduser()
        if path.suffix == ".gguf" or not (path / "config.json").is_file():
            raise BenchcalError(f"vLLM needs a Hugging Face model directory with config.json, got {path}")
    elif config.get("weights", "synthetic") == "synthetic":
        path = synthetic_hf_dir(str(config["model"]), _synthetic_overrides(config))
    else:
        raise BenchcalError(f"no model directory for weights {config.get('weights')!r}")
    options = config.get("engine_options") or {}
    load_format = "dummy" if is_synthetic_dir(path) else str(options.get("load_format", "auto"))
    return path, load_format


def kv_need_bytes(hf_config: Mapping[str, Any], context: int, batch: int, kv_dtype: str | None,
                  source: str) -> int:
    """KV bytes to pin for ``batch`` sequences of ``context`` tokens.

    Each sequence gets its context rounded up to 128-token blocks plus one block (the block a sequence
    starts when it reaches the rounded length), and the pool one more block: vLLM V1's block pool keeps a
    reserved null block (a pool of exactly the need estimates a shorter maximum model length and fails).
    """
    from predictor.architecture import from_hf_config

    arch = from_hf_config(dict(hf_config), id="vllm-model", source=source)
    per_sequence = int(arch.kv_elements_per_token(round_up_tokens(context, KV_ROUNDING_TOKENS) + KV_ROUNDING_TOKENS))
    null_block = int(arch.kv_elements_per_token(KV_ROUNDING_TOKENS))
    return (per_sequence * batch + null_block) * kv_bytes_per_element(kv_dtype)


def llm_kwargs(config: Mapping[str, Any], model_dir: Path, load_format: str,
               hf_config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for ``vllm.LLM`` and the resolved options to record (kv_pool, KV need, ...)."""
    options = default_engine_options(config)
    context, batch = int(config["context"]), int(config.get("batch") or 1)
    quant = str(config.get("quant") or "auto").lower()
    if quant not in QUANT_SETTINGS and load_format == "dummy":
        raise BenchcalError(f"quant {config.get('quant')!r} cannot be made synthetic for vLLM "
                            f"(supported: {', '.join(sorted(QUANT_SETTINGS))})")
    dtype, quantization = QUANT_SETTINGS.get(quant, ("auto", None))
    if str(options.get("api", "offline")) != "offline":
        raise BenchcalError(f"vLLM api {options.get('api')!r} is not implemented (supported: offline)")
    kv_pool = str(options["kv_pool"])
    if kv_pool not in ("pinned", "profiled"):
        raise BenchcalError(f"engine option kv_pool must be 'pinned' or 'profiled', got {kv_pool!r}")
    need = kv_need_bytes(hf_config, context, batch, config.get("kv_dtype"), str(model_dir))
    pinned = None
    if kv_pool == "pinned":
        pinned = int(options.get("kv_cache_memory_bytes") or pinned_kv_cache_bytes(need))
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": load_format,
        "skip_tokenizer_init": True,
        "max_model_len": context,
        "max_num_seqs": batch,
        "enable_prefix_caching": False,
        "enforce_eager": bool(options["enforce_eager"]),
        "gpu_memory_utilization": float(options["gpu_memory_utilization"]),
        "kv_cache_memory_bytes": pinned,
        "kv_cache_dtype": kv_cache_dtype(config.get("kv_dtype")),
        "dtype": options.get("dtype", dtype),
        "quantization": options.get("quantization", quantization),
        "tensor_parallel_size": int(config.get("device_count") or 1),
        "seed": int(options.get("seed", 0)),
        "disable_log_stats": False,  # per-request metrics (RequestStateStats) need stats on
        "trust_remote_code": bool(options.get("trust_remote_code", False)),
    }
    for key in ("max_num_batched_tokens", "block_size"):
        if options.get(key) is not None:
            kwargs[key] = int(options[key])
    resolved = {k: v for k, v in kwargs.items() if k not in ("model", "skip_tokenizer_init")}
    resolved.update({"kv_pool": kv_pool, "kv_need_bytes": need, "model_dir": str(model_dir)})
    return kwargs, resolved


class VllmSession:
    """One loaded ``LLM`` and the measurements made with it."""

    def __init__(self, llm: Any, config: Mapping[str, Any], hf_config: Mapping[str, Any],
                 load_info: LoadInfo) -> None:
        self.llm = llm
        self.batch = int(config.get("batch") or 1)
        text = hf_text_config(hf_config)
        self.vocab_size = int(text["vocab_size"])
        self.special_token_ids = special_token_ids(hf_config)
        self.load_info = load_info
        self._rng = random.Random(int((config.get("engine_options") or {}).get("seed", 0)) + 1)
        self._request_counter = 0

    @classmethod
    def open(cls, config: Mapping[str, Any], weights_path: str | None) -> VllmSession:
        """Build the ``LLM`` for ``config``; the returned session's ``load_info`` says what was built."""
        options = config.get("engine_options") or {}
        model_dir, load_format = resolve_model_dir(config, weights_path)
        hf_config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        kwargs, resolved = llm_kwargs(config, model_dir, load_format, hf_config)
        _set_environment(options, on_cpu=str(config.get("device", "cpu")) == "cpu")
        print(f"{OPTIONS_PREFIX} {json.dumps(resolved, sort_keys=True, default=str)}", file=sys.stderr, flush=True)
        from vllm import LLM

        start_s = time.perf_counter()  # load time: engine processes, weights, KV pool; not the import
        llm = LLM(**kwargs)
        load_s = time.perf_counter() - start_s
        effective = _effective_config(llm)
        print(f"{OPTIONS_PREFIX} {json.dumps({'effective': effective}, sort_keys=True, default=str)}",
              file=sys.stderr, flush=True)
        resolved["effective"] = effective
        inventory = _inventory(llm)
        text = hf_text_config(hf_config)
        info = LoadInfo(
            load_s=load_s,
            vocab_size=int(text["vocab_size"]),
            n_ctx=int(config["context"]),
            total_layers=int(text.get("num_hidden_layers") or 0) or None,
            extra={
                "engine_options": resolved,
                "weights": "synthetic" if load_format == "dummy" else str(model_dir),
                "inventory": inventory,
                "timing": {"tokens": "step_timestamps", "engine_timer": "request_metrics"},
            },
        )
        return cls(llm, config, hf_config, info)

    # ---------------------------------------------------------------------------------- requests

    def _run(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> dict[str, Any]:
        """Submit ``prompts`` together, step the engine to completion; per-request token times and metrics."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        try:
            self.llm.reset_prefix_cache()
        except Exception:  # noqa: BLE001 - older releases lack it; the prefix cache is off anyway
            pass
        ids = []
        submit_s = time.perf_counter()
        for prompt in prompts:
            self._request_counter += 1
            request_id = f"benchcal-{self._request_counter}"
            params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                                    temperature=0.0, detokenize=False, output_kind=RequestOutputKind.DELTA)
            engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)
            ids.append(request_id)
        times: dict[str, list[float]] = {rid: [] for rid in ids}
        metrics: dict[str, Any] = {}
        coalesced = 0
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now_s = time.perf_counter()
            for output in outputs:
                new_tokens = sum(len(c.token_ids) for c in output.outputs)
                times.setdefault(output.request_id, []).extend([now_s] * new_tokens)
                coalesced += output.request_id == ids[0] and new_tokens > 1
                if output.finished:
                    metrics[output.request_id] = getattr(output, "metrics", None)
        return {"submit_s": submit_s, "ids": ids, "times": times, "metrics": metrics, "coalesced": coalesced}

    def measure_prompt(self, prompt_token_ids: list[int]) -> PromptTiming:
        """One prompt, one generated token: TTFT on the wall clock; vLLM's own figure beside it."""
        run = self._run([prompt_token_ids], 1)
        first = run["ids"][0]
        ttft_s = run["times"][first][0] - run["submit_s"]
        stats = run["metrics"].get(first)
        engine_s = _span(stats, "scheduled_ts", "first_token_ts")
        extra = {"engine_timer": "request_metrics" if engine_s is not None else None}
        if stats is not None:
            extra["queue_s"] = _span(stats, "queued_ts", "scheduled_ts")
            extra["first_token_latency_s"] = getattr(stats, "first_token_latency", None)
        return PromptTiming(prompt_tokens=len(prompt_token_ids), ttft_s=ttft_s, prefill_s=ttft_s,
                            engine_prefill_s=engine_s,
                            engine_prompt_tokens=len(prompt_token_ids) if engine_s is not None else None,
                            extra=extra)

    def measure_decode(self, prompt_token_ids: list[int], n_gen: int) -> DecodeTiming:
        """``batch`` fresh prompts of one length decoded together for ``n_gen`` tokens each."""
        prompts = [prompt_token_ids] + [self._fresh_prompt(len(prompt_token_ids)) for _ in range(self.batch - 1)]
        run = self._run(prompts, n_gen)
        first = run["ids"][0]
        token_times = run["times"][first]
        engine_s = _span(run["metrics"].get(first), "first_token_ts", "last_token_ts")
        method = "request_metrics" if engine_s is not None and n_gen > 1 else None
        if method is None and n_gen > 2:
            engine_s = self._two_lengths_decode_s(len(prompt_token_ids), n_gen, run)
            method = "two_lengths"
        extra = {"tokens": "step_timestamps", "engine_timer": method, "coalesced_steps": run["coalesced"],
                 "ttft_s": token_times[0] - run["submit_s"] if token_times else None}
        return DecodeTiming(context_at_start=len(prompt_token_ids), submit_s=run["submit_s"],
                            token_times_s=token_times, batch=len(prompts), engine_decode_s=engine_s,
                            engine_decode_tokens=(n_gen - 1) * len(prompts) if engine_s is not None else None,
                            extra=extra)

    def _two_lengths_decode_s(self, prompt_tokens: int, n_gen: int, long_run: Mapping[str, Any]) -> float | None:
        """Decode seconds for ``n_gen - 1`` tokens from the wall time of a long and a short generation."""
        n_short = max(2, n_gen // 4)
        prompts = [self._fresh_prompt(prompt_tokens) for _ in range(self.batch)]
        short = self._run(prompts, n_short)
        long_wall = long_run["times"][long_run["ids"][0]][-1] - long_run["submit_s"]
        short_wall = short["times"][short["ids"][0]][-1] - short["submit_s"]
        per_token_s = (long_wall - short_wall) / (n_gen - n_short)
        return per_token_s * (n_gen - 1) if per_token_s > 0 else None

    def _fresh_prompt(self, n_tokens: int) -> list[int]:
        return random_token_ids(n_tokens, self.vocab_size, self._rng, sorted(self.special_token_ids))

    def close(self) -> None:
        """Drop the ``LLM`` (its engine-core and worker processes exit with it)."""
        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        self.llm = None
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            try:
                engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort; the runner kills the process group anyway
                pass
        gc.collect()


def _span(stats: Any, start: str, end: str) -> float | None:
    """``stats.end - stats.start`` in seconds when both engine timestamps are set, else None."""
    if stats is None:
        return None
    t0, t1 = getattr(stats, start, None), getattr(stats, end, None)
    if not t0 or not t1 or t1 < t0:
        return None
    return float(t1 - t0)


def _effective_config(llm: Any) -> dict[str, Any]:
    """Settings vLLM chose itself (batched-token budget, block size, KV blocks, graph mode), when readable."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    if config is None:
        return {}
    cache, scheduler, model = config.cache_config, config.scheduler_config, config.model_config
    compilation = getattr(config, "compilation_config", None)
    return {
        "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
        "block_size": getattr(cache, "block_size", None),
        "num_kv_blocks": getattr(cache, "num_gpu_blocks", None),
        "dtype": str(getattr(model, "dtype", None)),
        "enforce_eager": getattr(model, "enforce_eager", None),
        "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None)),
    }


def _inventory(llm: Any) -> dict[str, Any]:
    """Run :func:`module_inventory` in the worker(s) and print it where the log parser finds it."""
    try:
        results = llm.apply_model(module_inventory)
    except Exception as exc:  # noqa: BLE001 - the inventory is a cross-check; never fail a run for it
        print(f"{INVENTORY_PREFIX} unavailable ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
        return {}
    first = results[0] if results else {}
    print(f"{INVENTORY_PREFIX} weights_bytes={first.get('weights_bytes', 0)} "
          f"kv_cache_tensor_bytes={first.get('kv_cache_tensor_bytes', 0)} "
          f"packed_weights={first.get('packed_weights', 0)} workers={len(results)}", file=sys.stderr, flush=True)
    return {"per_worker": results}
