"""vLLM's KV pool and how many sequences it holds, as vLLM sizes them on a GPU and on a CPU.

vLLM's GPU worker profiles one forward pass, then gives the KV cache what is left of its share of the device:

    kv_pool = gpu_memory_utilization x device total - (weights + non-torch + activation peak + CUDA graphs)

(``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``: "Available KV cache memory"; 0.32.0). The
device total is what the CUDA driver reports: the catalogue's ``cuda_total_gib`` where a log states it, else a little
under the catalogue's memory (``vllm_visible_memory_share``);
the memory the worker held before it loaded the model (the CUDA context, ``runtime_fixed_gib``) is not taken from
the pool. The predictor's memory model gives each other term per device (the weights on the device and, in
``runtime_bytes``, ``vllm_non_torch_gib``, ``vllm_graph_gib`` and the profile run's activations with its sampler's
buffers, ``vllm_sampler_copies``), so the pool is that formula over them. The pool is cut into blocks of
``traits("vllm").kv_block_tokens`` tokens; vLLM logs it as "GPU KV cache size: N tokens" and "Maximum
concurrency for C tokens per request: N / C x" (``vllm/v1/core/kv_cache_utils.py``), which
``max_concurrent_sequences`` is (whole sequences: rounded down).
"""

from __future__ import annotations

import math
from typing import Any

from predictor import memory as mem
from predictor.engines import traits
from predictor.eras import kv_pool_counts_cuda_graphs
from predictor.quants import resolve_kv_dtype

GIB = float(2**30)


def kv_pool(est: Any, gpu_memory_utilization: float = mem.VLLM_GPU_MEMORY_UTILIZATION,
            max_num_seqs: int | None = None, enforce_eager: bool = False,
            flashinfer_sampler: bool = False) -> dict[str, Any] | None:
    """``{kv_pool_gib, kv_pool_tokens, max_concurrent_sequences, max_running_sequences, gpu_memory_utilization,
    max_num_seqs, formula}`` for a vLLM prediction on a GPU (``est``: a :class:`predictor.estimate.Estimate`), per
    device of a tensor-parallel group; None for another engine or device kind (llama.cpp sizes its cache by
    ``--ctx`` instead). ``max_concurrent_sequences`` is what the pool holds (vLLM's "Maximum concurrency" log
    line); ``max_running_sequences`` also respects ``max_num_seqs`` (default: vLLM's on the device). For a version
    before 0.21 (``est.era["build"]``, :func:`predictor.eras.kv_pool_counts_cuda_graphs`) the CUDA graphs
    (``vllm_graph_gib``, none with ``enforce_eager``) are not taken from the pool: vLLM captured them after sizing
    it. ``flashinfer_sampler``: the profile run warmed up FlashInfer's sort-free sampler (no sort buffers in the
    runtime, which ``est`` was predicted with); ``sampler`` in the result names it on a GPU."""
    if not traits(est.engine).profiled_runtime or est.device.kind not in ("gpu", "cpu"):
        return None
    v = est.values
    n = max(int(est.device_count), 1)
    per_device_weights = float(v["weights_bytes"]) / n
    extra: dict[str, Any] = {}
    if est.device.kind == "cpu":
        pool, formula, block, extra = _cpu_pool(est, gpu_memory_utilization, per_device_weights)
    else:
        # the runtime the profile measures: all but the context the worker held before it (runtime_fixed_gib)
        per_device_runtime = float(v["runtime_bytes"]) / n - float(est.coefficients["runtime_fixed_gib"]) * GIB
        build = (est.era or {}).get("build")
        graphs_counted = kv_pool_counts_cuda_graphs(est.engine, build)
        if not graphs_counted and not enforce_eager:  # captured after the pool was sized, outside the budget
            per_device_runtime -= float(est.coefficients["vllm_graph_gib"]) * GIB
        # the total CUDA reports: the catalogue's where a log states it, else the share of the memory the logs show
        total = est.device.cuda_total_gib
        share = float(est.coefficients["vllm_visible_memory_share"])
        visible = f"{total:g} GiB (the total CUDA reports)" if total else f"{share:g} x {est.device.memory_gib:g} GiB"
        requested = gpu_memory_utilization * (total or share * est.device.memory_gib) * GIB
        pool = max(requested - per_device_weights - per_device_runtime, 0.0)
        block = traits(est.engine).kv_block_tokens
        sampler = ("FlashInfer's sampler, no sort buffers" if flashinfer_sampler
                   else "the sampler's sort buffers")
        counted = (f"non-torch, CUDA graphs, profile-run activations, {sampler}" if graphs_counted else
                   f"non-torch, profile-run activations, {sampler}; vLLM {build} captured its CUDA graphs "
                   "after sizing the pool, 0.21 on counts them")
        extra["sampler"] = "flashinfer" if flashinfer_sampler else "pytorch"
        formula = (f"{gpu_memory_utilization:g} x {visible} - weights "
                   f"{per_device_weights / GIB:.2f} GiB - runtime {per_device_runtime / GIB:.2f} GiB ({counted}) "
                   "per device")
    # KV bytes one sequence of the asked context takes on each device (sliding windows capped, blocks rounded)
    # (a tensor-parallel rank's share: KV heads fewer than the ranks, and MLA's latent, are held on every rank)
    per_sequence = float(mem.kv_cache_bytes(est.model, est.context, 1, _kv_bytes(est), est.engine)
                         * mem.kv_replicas(est.model, n, est.engine)) / n
    tokens = int(pool / per_sequence * est.context) if per_sequence > 0 else 0
    tokens -= tokens % block
    held = int(pool // per_sequence) if per_sequence > 0 else 0
    seqs = int(max_num_seqs or mem.vllm_batch_defaults(est.device)[1])
    return {
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": seqs,
        "max_running_sequences": min(held, seqs),
        "kv_pool_gib": round(pool / GIB, 3),
        "kv_pool_tokens": tokens,
        "max_concurrent_sequences": held,
        "context": est.context,
        **extra,
        "formula": formula,
    }


VLLM_CPU_BLOCK_TOKENS = 128  # vLLM's CPU backend's KV block (the records' effective block_size)


def _cpu_pool(est: Any, utilization: float, weights: float) -> tuple[float, str, int, dict[str, Any]]:
    """vLLM's CPU worker (``vllm/v1/worker/cpu_worker.py``): it reserves ``ceil(utilization x node memory)``, the
    memory of the NUMA node its first CPU is on, and gives the KV cache what its own process does not already hold
    once warmed up ("Auto set (kv/node) GiB for KV cache ... N GiB memory was consumed by non-kv usages"): the
    weights and ``vllm_cpu_worker_gib``. Returns (pool bytes, formula, KV block tokens, extra figures)."""
    node_gib = float(est.device.memory_node_gib or est.device.memory_gib)
    worker_gib = float(est.coefficients["vllm_cpu_worker_gib"])
    pool = max(math.ceil(utilization * node_gib * GIB) - weights - worker_gib * GIB, 0.0)
    formula = (f"ceil({utilization:g} x {node_gib:.2f} GiB of the CPU's memory node) - weights "
               f"{weights / GIB:.2f} GiB - worker {worker_gib:.2f} GiB (vllm_cpu_worker_gib)")
    return pool, formula, VLLM_CPU_BLOCK_TOKENS, {"memory_node_gib": round(node_gib, 3)}


def _kv_bytes(est: Any) -> float:
    return resolve_kv_dtype(est.kv_dtype, est.engine).bytes_per_element
