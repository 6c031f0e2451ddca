"""What the predictor knows about each engine, in one place: the engine set and one traits record per engine.

The analytical model is the same for every engine; these are the differences the formulas branch on. Adding an
engine to the predictor is one entry here (and its defaults in ``predictor/coefficients.py``); the harness's
engines (``harness/engines/``) may measure more engines than the predictor describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.errors import BenchcalError


@dataclass(frozen=True)
class EngineTraits:
    """One engine's behaviour, as the memory and throughput formulas need it."""

    name: str
    default_quant: str  # weights format when none is given (a GGUF's own type wins)
    default_kv_dtype: str
    gguf: bool  # loads GGUF files: llama-quantize tensor plans, MXFP4 experts kept in F16/BF16 files
    host_embedding: bool  # keeps the input embedding of an untied model in host memory
    layer_offload: bool  # offloads whole layers to the host, each with its KV cache
    tensor_parallel: bool  # splits a model over devices by tensor parallelism (else by layers)
    pcie_streamed_offload: bool  # offloaded weights cross PCIe every step (vLLM cpu_offload_gb)
    cpu_kernel_paths: bool  # CPU matmuls on several kernel paths (repacked, float, Q8_0, generic)
    attention_through_memory: bool  # without flash attention, scores and per-head K/V reads go through memory
    kv_block_tokens: int  # the KV cache is allocated in blocks of this many tokens (1: per token)
    fp16_accumulate: bool  # prefill matmuls accumulate in FP16 where the device has that rate
    profiled_runtime: bool  # runtime memory from a profile run's activations, CUDA graphs, non-torch (vLLM)
    versioned_by: str  # what names a release in eras: "build" (a build number) or "version" (x.y)
    # its server batches the requests in flight (continuous batching) rather than serving them in turn
    # (llama-cpp-python's server, which the harness measures, runs one request at a time)
    server_batches: bool
    quantized_v_needs_flash_attn: bool = False  # a block-quantized V cache only with flash attention (llama.cpp)


TRAITS: dict[str, EngineTraits] = {
    "llama.cpp": EngineTraits(
        name="llama.cpp", default_quant="Q4_K_M", default_kv_dtype="f16", gguf=True,
        host_embedding=True, layer_offload=True, tensor_parallel=False, pcie_streamed_offload=False,
        cpu_kernel_paths=True, attention_through_memory=True, kv_block_tokens=1, fp16_accumulate=True,
        profiled_runtime=False, versioned_by="build", server_batches=False, quantized_v_needs_flash_attn=True),
    "vllm": EngineTraits(
        name="vllm", default_quant="BF16", default_kv_dtype="bf16", gguf=False,
        host_embedding=False, layer_offload=False, tensor_parallel=True, pcie_streamed_offload=True,
        cpu_kernel_paths=False, attention_through_memory=False, kv_block_tokens=16, fp16_accumulate=False,
        profiled_runtime=True, versioned_by="version", server_batches=True),
}
ENGINES: tuple[str, ...] = tuple(TRAITS)


def traits(engine: str) -> EngineTraits:
    """The traits of a predicted engine; BenchcalError for one the predictor does not describe."""
    try:
        return TRAITS[engine]
    except KeyError:
        raise BenchcalError(f"unknown engine '{engine}' (choose from: {', '.join(ENGINES)})") from None
