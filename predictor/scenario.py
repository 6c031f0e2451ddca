"""One configuration to predict, as one frozen value: model, device, engine, weights format, context, prompt,
batch, KV dtype, flash attention, micro-batch, offload, device count, engine build and the host it runs beside.

A :class:`Scenario` is built once, from the command line (``benchcal predict``), a run configuration or record
(:meth:`Scenario.from_config`: the harness's predictions and the calibration's features read the same fields the
same way), and varied with :meth:`Scenario.replace`. :func:`predictor.estimate.predict_scenario` takes one.

:func:`scenario_inputs` is the one translation of a scenario into the analytical model's inputs, shared by
``predict_scenario`` and the calibration's features (:mod:`calibration.features`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from predictor.architecture import ModelArch
from predictor.backends import Backend, scenario_backend
from predictor.devices import Device, resolve_device
from predictor.engines import traits
from predictor.eras import unpacking_kernel
from predictor.errors import BenchcalError, non_negative, positive
from predictor.memory import tensor_parallel_refusal, vllm_batch_defaults
from predictor.models import resolve_model
from predictor.quants import (
    QuantFormat,
    default_format,
    normalize_engine,
    quantized_kv,
    resolve_kv_dtype,
    resolve_quant,
)
from predictor.weights import WEIGHTS_FROM_FILE, format_bits, kernel_kwargs, known_weights_bytes

DEFAULT_CONTEXT = 8192
DEFAULT_PROMPT_TOKENS = 4096  # like the public calculators' TTFT figure
DEFAULT_N_UBATCH = 512  # llama.cpp's default micro-batch (-ub)
DEFAULT_HOST_BANDWIDTH_GBS = 60.0  # dual-channel DDR5-4800 (2 x 38.4 GB/s peak), a typical desktop host
DEFAULT_HOST_MEMORY_GIB = 64.0


@dataclass(frozen=True)
class Scenario:
    """What one prediction describes. ``model`` and ``device`` are catalogue ids (or names) or resolved objects;
    ``quant`` None is :func:`predictor.quants.default_format` (the GGUF's own type, the release's format, the engine's
    default); ``kv_dtype`` None the engine's default;
    ``engine_build`` None the newest era with data; ``host_*`` None the defaults for the host beside a GPU (a CPU
    device's own figures on a CPU); ``gpu_memory_utilization`` None vLLM's default (0.92); ``weights_bytes`` None
    the weights sized from the model and the format (its GGUF file, llama-quantize's tensor types, else the format's
    average width)."""

    model: str | ModelArch
    device: str | Device | None = None  # None: a grid's base, whose devices are its axis
    engine: str = "llama.cpp"
    quant: str | None = None
    context: int = DEFAULT_CONTEXT
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    prompt_depth: int = 0  # tokens already in the KV cache when the prompt arrives (a conversation's earlier turns)
    batch: int = 1
    kv_dtype: str | None = None
    flash_attn: bool = True
    n_ubatch: int = DEFAULT_N_UBATCH
    offload_fraction: float = 0.0
    device_count: int = 1
    engine_build: str | int | None = None
    host_bandwidth_gbs: float | None = None
    host_memory_gib: float | None = None
    enforce_eager: bool = False
    flashinfer_sampler: bool = False  # vLLM on a GPU: FlashInfer's sort-free top-k/top-p sampler (see evaluate)
    gpu_memory_utilization: float | None = None
    weights_bytes: float | None = None  # the weights' tensor bytes when known (a measured file); None: sized
    max_num_seqs: int | None = None  # vLLM: the most sequences a batch holds (None: its default on the device)
    max_num_batched_tokens: int | None = None  # vLLM: tokens one step may take (None: its default on the device)
    server: str | None = None  # the server under load (llama.cpp: "llama-server" or "llama-cpp-python"; None: default)
    logits_all: bool = False  # every prompt token's logits computed (llama-perplexity), not the last one's
    backend: str | None = None  # llama.cpp's backend (CUDA, ROCm, Vulkan, Metal, SYCL, CPU; None: the device's default)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, model: Any = None, device: Any = None,
                    host: Mapping[str, Any] | None = None, prompt_tokens: int | None = None) -> Scenario:
        """The scenario a run configuration (a record's ``config``) measures.

        ``model`` / ``device``: resolved objects to use instead of the config's ids (the harness passes the
        architecture its engine lays out and the host CPU as a device); ``host``: the host's measured bandwidth
        and memory; ``prompt_tokens``: the prompt to predict for (default: the config's longest). vLLM's batch
        limits and device share come from ``engine_options`` as ``vllm serve`` takes them.
        """
        options = config.get("engine_options") or {}
        prompts = list(config.get("prompt_tokens") or [])
        return cls(
            model=model if model is not None else str(config["model"]),
            device=device if device is not None else str(config["device"]),
            engine=str(config.get("engine") or "llama.cpp"),
            quant=config.get("quant"),
            context=int(config.get("context") or DEFAULT_CONTEXT),
            prompt_tokens=int(prompt_tokens if prompt_tokens is not None else max(prompts or [512])),
            batch=int(config.get("batch") or 1),
            kv_dtype=config.get("kv_dtype"),
            flash_attn=bool(options.get("flash_attn", False)),
            n_ubatch=int(options.get("n_ubatch") or DEFAULT_N_UBATCH),
            offload_fraction=float(config.get("offload_fraction") or 0.0),
            device_count=int(config.get("device_count") or 1),
            host_bandwidth_gbs=(host or {}).get("bandwidth_gbs"),
            host_memory_gib=(host or {}).get("memory_gib"),
            enforce_eager=bool(options.get("enforce_eager", False)),
            flashinfer_sampler=options.get("sampler") == "flashinfer",
            gpu_memory_utilization=options.get("gpu_memory_utilization"),
            max_num_seqs=options.get("max_num_seqs"),
            max_num_batched_tokens=options.get("max_num_batched_tokens"),
            server=(config.get("serve") or {}).get("server"),
            backend=config.get("backend"),
        )


def require_context(arch: ModelArch, context: int) -> ModelArch:
    """The model to predict ``context`` tokens with: ``arch`` itself up to its maximum; above it, ``arch`` with the
    RoPE scaling its model card documents enabled (:meth:`ModelArch.with_long_context`) up to the scaled maximum;
    else a BenchcalError (a positive context is required)."""
    positive("--ctx", context)
    if context <= arch.max_context:
        return arch
    scaled = arch.with_long_context()
    if context <= scaled.max_context:
        return scaled
    rs = arch.rope_scaling
    beyond = (f" ({rs.describe()}, as {'its config sets' if rs.in_config else 'its card documents'})"
              if rs and scaled.max_context > arch.native_max_context else "")
    raise BenchcalError(f"context {context} is above {arch.id}'s maximum of {scaled.max_context} tokens{beyond}")


def device_kwargs(device: Device, engine: str) -> dict[str, Any]:
    """The device's figures as keyword arguments of ``evaluate`` for ``engine`` (whose matmul peak may differ)."""
    tflops = device.matmul_tflops(engine)
    return {
        "memory_gib": device.memory_gib,
        "usable_gib": np.nan if device.usable_gib is None else device.usable_gib,
        "kind": device.kind,
        "bandwidth_gbs": np.nan if device.bandwidth_gbs is None else device.bandwidth_gbs,
        "tflops": np.nan if tflops is None else tflops,
    }


@dataclass(frozen=True)
class ScenarioInputs:
    """A scenario resolved into what :func:`evaluate` takes: its weights format and KV dtype, the weights' bytes
    where known and how (``weights_source``), and ``kwargs``, every input of ``evaluate`` but the model, the
    engine and the coefficients (prompt and context as scalars)."""

    quant: QuantFormat
    kv: Any
    weights_bytes: float | None
    weights_source: str
    kwargs: dict[str, Any]
    backend: Backend | None = None


def scenario_arch(s: Scenario) -> ModelArch:
    return s.model if isinstance(s.model, ModelArch) else resolve_model(s.model)


def scenario_device(s: Scenario) -> Device:
    if s.device is None:
        raise BenchcalError("a prediction needs a device")
    return s.device if isinstance(s.device, Device) else resolve_device(s.device)


def validate_scenario(s: Scenario, arch: ModelArch, dev: Device, engine: str) -> ModelArch:
    """What a user can ask for that the model cannot describe: a one-line BenchcalError each. Returns the model
    to predict with (:func:`require_context`: with its documented long-context scaling when the context needs it)."""
    positive("--ctx", s.context)
    positive("--prompt", s.prompt_tokens)
    positive("--batch", s.batch)
    positive("--gpus", s.device_count)
    positive("--n-ubatch", s.n_ubatch)
    for flag, value in (("--max-num-seqs", s.max_num_seqs), ("--max-num-batched-tokens", s.max_num_batched_tokens)):
        if value is not None:
            positive(flag, value)
    non_negative("--offload", s.offload_fraction)
    non_negative("--prompt-depth", s.prompt_depth)
    if s.prompt_depth and s.prompt_depth + s.prompt_tokens > s.context:
        raise BenchcalError(f"--prompt-depth {s.prompt_depth} + --prompt {s.prompt_tokens} tokens do not fit a context of "
                            f"{s.context} (--ctx)")
    if s.gpu_memory_utilization is not None and not 0 < s.gpu_memory_utilization <= 1:
        raise BenchcalError(f"--gpu-memory-utilization is a fraction of the device in (0, 1], got {s.gpu_memory_utilization}")
    if s.offload_fraction > 1:
        raise BenchcalError(f"--offload is a fraction of the layers, between 0 and 1, got {s.offload_fraction}")
    arch = require_context(arch, s.context)
    if engine not in dev.engines:
        raise BenchcalError(f"{engine} does not run on {dev.name} (engines there: {', '.join(dev.engines)})")
    if s.device_count > 1 and dev.kind != "gpu":
        raise BenchcalError(f"--gpus {s.device_count}: tensor parallelism needs discrete GPUs, {dev.name} is {dev.kind}")
    if traits(engine).quantized_v_needs_flash_attn and s.kv_dtype and not s.flash_attn and quantized_kv(s.kv_dtype):
        raise BenchcalError(f"--kv-dtype {s.kv_dtype} without flash attention: {engine} refuses a quantized V cache "
                            "unless flash attention is on (drop --no-flash-attn, or use --kv-dtype f16)")
    if s.device_count > 1 and traits(engine).tensor_parallel:
        refusal = tensor_parallel_refusal(arch, s.device_count)
        if refusal:
            raise BenchcalError(f"--gpus {s.device_count}: {engine} refuses this tensor-parallel size: {refusal}")
    scenario_backend(s.backend, dev.vendor, dev.name, engine)
    return arch


def resolved_backend(s: Scenario, dev: Device, engine: str) -> Backend | None:
    """The scenario's llama.cpp backend (:func:`predictor.backends.scenario_backend`): the one it names, else the
    default of the device's vendor; None for vLLM."""
    return scenario_backend(s.backend, dev.vendor, dev.name, engine)


def scenario_inputs(s: Scenario, arch: ModelArch | None = None, dev: Device | None = None,
                    engine: str | None = None) -> ScenarioInputs:
    """The one translation of a scenario into the model's inputs, used by :func:`predict_scenario` and by the
    calibration's features (:mod:`calibration.features`), so a fitted coefficient meets the inputs a prediction
    gives it. ``arch`` / ``dev`` / ``engine``: the scenario's, resolved already (else resolved here)."""
    eng = engine or normalize_engine(s.engine)
    arch = arch or scenario_arch(s)
    dev = dev or scenario_device(s)
    q = resolve_quant(s.quant or default_format(arch, eng), eng)
    kv = resolve_kv_dtype(s.kv_dtype or traits(eng).default_kv_dtype, eng)
    if s.weights_bytes is not None:
        exact, weights_source = float(s.weights_bytes), WEIGHTS_FROM_FILE
    else:
        exact, weights_source = known_weights_bytes(arch, q, eng)
    expert_bits, other_bits = format_bits(arch, q, eng)
    backend = resolved_backend(s, dev, eng)
    # the tiles a backend multiplies quantized experts in during prefill (F16/BF16 experts are not padded on GPUs)
    tile = backend.expert_tile(dev.architecture) if backend is not None else None
    if tile is not None and tile > 1 and not (expert_bits and expert_bits < 16.0):
        tile = 1
    host_bw = float(s.host_bandwidth_gbs or (dev.bandwidth_gbs if dev.kind == "cpu" else DEFAULT_HOST_BANDWIDTH_GBS))
    batch_defaults = vllm_batch_defaults(dev)
    kwargs = {
        **device_kwargs(dev, eng),
        "bits_per_weight": expert_bits,
        "bits_per_weight_non_expert": other_bits,
        "exact_weights_bytes": exact,
        "kv_bytes_per_element": kv.bytes_per_element,
        "context": s.context, "batch": s.batch, "prompt_tokens": s.prompt_tokens, "prompt_depth": s.prompt_depth,
        "logits_all": bool(s.logits_all), "device_count": s.device_count,
        "offload_fraction": s.offload_fraction, "flash_attn": s.flash_attn, "n_ubatch": s.n_ubatch,
        "host_bandwidth_gbs": host_bw,
        "host_memory_gib": s.host_memory_gib or DEFAULT_HOST_MEMORY_GIB,
        "enforce_eager": s.enforce_eager,
        "flashinfer_sampler": s.flashinfer_sampler,
        "max_batched_tokens": s.max_num_batched_tokens or batch_defaults[0],
        "max_num_seqs": s.max_num_seqs or batch_defaults[1],
        "expert_tile": np.nan if tile is None else float(tile),
        # a backend whose prompts dequantize quantized weights for an FP16 GEMM on this architecture (CUDA on Volta)
        "cublas_dequant": bool(backend is not None and backend.quantized_prefill_through_fp16(dev.architecture)),
        **kernel_kwargs(arch, q.id),
    }
    if unpacking_kernel(eng, s.engine_build, q.id):  # every layer weight through an unpacking kernel (vLLM's AWQ GEMM)
        kwargs["kquant_low_weights"] = 1.0
    return ScenarioInputs(q, kv, exact, weights_source, kwargs, backend)
