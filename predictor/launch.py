"""Launch commands for llama.cpp (llama-server), vLLM (vllm serve) and Ollama that match a prediction.

The commands carry the configuration: context, layers on the GPU (the most that fit when the
model needs offload), flash attention, KV cache type, parallel sequences, tensor parallelism, and
vLLM's ``--gpu-memory-utilization`` at the share the prediction sized its KV pool at (vLLM's default, 0.92, or the
one asked for), so the server that starts holds the pool predicted.

This module stays in the predictor, below the reports (:mod:`benchcal.reports`): the commands are part of a
prediction's JSON contract, and the harness stores that prediction, commands included, in every run record it
writes, so they must be computable where the harness can reach them. They are pure string formatting of the
estimate; the one prediction they need (the offload a command sets) comes in as a function argument.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from predictor.memory import tensor_parallel_refusal

if TYPE_CHECKING:  # pragma: no cover
    from predictor.estimate import Estimate

GIB = float(2**30)

# The vLLM format closest to a GGUF quant, by width.
_VLLM_EQUIVALENT = {
    "F32": "BF16", "F16": "F16", "BF16": "BF16", "Q8_0": "FP8", "Q6_K": "FP8", "Q5_K_M": "FP8",
    "Q4_K_M": "AWQ", "Q4_0": "AWQ", "IQ4_XS": "AWQ", "Q3_K_M": "AWQ", "Q2_K": "AWQ", "UD-Q2_K_XL": "AWQ",
    "MXFP4": "MXFP4",
}
_LLAMA_EQUIVALENT = {"FP8": "Q8_0", "AWQ": "Q4_K_M", "GPTQ": "Q4_K_M"}
_VLLM_QUANT_FLAG = {"AWQ": "awq", "GPTQ": "gptq", "FP8": "fp8"}


# Organisations that publish GGUF and AWQ / GPTQ files of their own models as ``<model>-GGUF``, ``<model>-AWQ``,
# ``<model>-GPTQ-Int4`` (Qwen: Qwen2.5, Qwen3, QwQ).
GGUF_PUBLISHERS = ("Qwen/",)


def _llama_model_arg(est: Estimate, quant: str) -> str:
    """What llama-server loads: the model's own .gguf; the GGUF repository its catalogue entry names; its
    publisher's ``<hf_id>-GGUF`` where that publisher releases GGUFs; else a local file to convert it into (no
    repository is guessed)."""
    m = est.model
    if m.source and m.source.endswith(".gguf"):
        return f"-m {m.source}"
    if m.gguf_repo:
        return f"-hf {m.gguf_repo}:{quant}"
    if m.hf_id and m.hf_id.startswith(GGUF_PUBLISHERS):
        return f"-hf {m.hf_id}-GGUF:{quant}"
    name = m.hf_id.split("/")[-1] if m.hf_id else m.id
    return f"-m {name}-{quant}.gguf"


def _long_context(est: Estimate):
    """The model card's RoPE scaling when this prediction enables it (a context beyond the config's maximum)."""
    return est.model.rope_scaling if est.model.long_context else None


def llama_cpp_rope_flags(est: Estimate) -> list[str]:
    """llama-server's flags for a documented RoPE scaling (``--rope-scaling``, ``--rope-scale``,
    ``--yarn-orig-ctx``: llama.cpp's common/arg.cpp; its server test of context extension passes the three)."""
    rs = _long_context(est)
    if rs is None or rs.type not in ("yarn", "linear"):
        return []
    flags = [f"--rope-scaling {rs.type}", f"--rope-scale {rs.factor:g}"]
    if rs.type == "yarn":
        flags.append(f"--yarn-orig-ctx {rs.original_max_context}")
    return flags


def llama_cpp_command(est: Estimate) -> str:
    """``llama-server`` for this configuration; -ngl is the most layers that fit when offload is needed."""
    v = est.values
    quant = est.quant.id if "llama.cpp" in est.quant.engines else _LLAMA_EQUIVALENT.get(est.quant.id, "Q4_K_M")
    layers = est.model.num_layers
    if est.device.kind == "cpu":
        ngl = 0
    elif est.offload_fraction > 0:
        ngl = round((1.0 - est.offload_fraction) * layers)
    elif est.verdict == "needs offload":
        ngl = int(v["max_gpu_layers"])
    else:
        ngl = 999
    parts = [f"llama-server {_llama_model_arg(est, quant)}", f"--ctx-size {est.context * est.batch}",
             *llama_cpp_rope_flags(est)]
    if est.batch > 1:
        parts.append(f"--parallel {est.batch}")
    parts.append(f"-ngl {ngl}")
    parts.append(f"--flash-attn {'on' if est.flash_attn else 'off'}")
    kv = est.kv_dtype if est.kv_dtype in ("f16", "bf16", "q8_0", "q4_0") else "q8_0"
    if kv != "f16":
        parts.append(f"-ctk {kv} -ctv {kv}")
    if est.n_ubatch != 512:
        parts.append(f"-ub {est.n_ubatch}")
    if est.device_count > 1:
        parts.append("--split-mode layer --tensor-split " + ",".join(["1"] * est.device_count))
    parts.append("--port 8080")
    return " ".join(parts)


def ollama_command(est: Estimate) -> str:
    """Ollama for this configuration: the server's settings are environment variables of ``ollama serve``
    (``OLLAMA_CONTEXT_LENGTH``, ``OLLAMA_FLASH_ATTENTION``, ``OLLAMA_KV_CACHE_TYPE``, ``OLLAMA_NUM_PARALLEL``;
    Ollama's docs/faq.md and docs/context-length.mdx), and it runs a Hugging Face GGUF as ``hf.co/<repo>:<quant>``.
    Ollama places the layers itself, so offload has no flag here."""
    quant = est.quant.id if "llama.cpp" in est.quant.engines else _LLAMA_EQUIVALENT.get(est.quant.id, "Q4_K_M")
    model = _llama_model_arg(est, quant)
    rs = _long_context(est)
    if rs is not None:
        return (f"# Ollama has no setting for {rs.type} RoPE scaling: beyond {est.model.native_max_context:,} tokens "
                "use the llama.cpp or vLLM command")
    if not model.startswith("-hf "):
        return f"# Ollama: make a model of {model.removeprefix('-m ')} with a Modelfile (FROM <file>), then ollama run it"
    env = [f"OLLAMA_CONTEXT_LENGTH={est.context}", f"OLLAMA_FLASH_ATTENTION={1 if est.flash_attn else 0}"]
    if est.flash_attn and est.kv_dtype in ("q8_0", "q4_0"):  # Ollama quantizes the KV cache only with flash attention
        env.append(f"OLLAMA_KV_CACHE_TYPE={est.kv_dtype}")
    if est.batch > 1:
        env.append(f"OLLAMA_NUM_PARALLEL={est.batch}")
    return f"{' '.join(env)} ollama serve & ollama run hf.co/{model.removeprefix('-hf ')}"


def gpu_memory_utilization(total_bytes: float, device_count: int, memory_gib: float) -> float:
    """Fraction of each GPU vLLM should reserve: the predicted need per device plus 2%, in [0.10, 0.95]."""
    need = total_bytes / max(device_count, 1) / (memory_gib * GIB)
    return min(0.95, max(0.10, math.ceil((need + 0.02) * 100.0) / 100.0))


def vllm_command(est: Estimate, vllm_est: Estimate | None) -> str:
    """``vllm serve`` for this configuration (from a vLLM prediction of the nearest vLLM format)."""
    if "vllm" not in est.device.engines:
        return f"# vLLM does not run on {est.device.name}"
    e = vllm_est or est
    m = e.model
    refusal = tensor_parallel_refusal(m, e.device_count)
    if refusal:
        return f"# vLLM refuses --tensor-parallel-size {e.device_count} here: {refusal}"
    repo = m.hf_id or (m.source if m.source and not m.source.endswith(".gguf") else m.id)
    quant = e.quant.id
    unrecorded = False
    if quant in ("AWQ", "GPTQ") and m.hf_id:
        # Qwen publishes its own quantized checkpoints (<model>-AWQ, <model>-GPTQ-Int4); for other models none is
        # recorded, and the line says what to serve rather than guess a repository: a comment, not a command
        unrecorded = not m.hf_id.startswith(GGUF_PUBLISHERS)
        repo = (f"<a {quant} checkpoint of {m.hf_id}>" if unrecorded
                else f"{m.hf_id}-{'AWQ' if quant == 'AWQ' else 'GPTQ-Int4'}")
    parts = [f"vllm serve {repo}", f"--max-model-len {e.context}"]
    rs = _long_context(e)
    if rs is not None:  # the card's rope_scaling block, as vLLM's --hf-overrides takes a config change
        block = {"rope_type": rs.type, "factor": rs.factor, "original_max_position_embeddings": rs.original_max_context}
        parts.append(f"--hf-overrides '{json.dumps({'rope_scaling': block}, separators=(',', ':'))}'")
    if e.device.kind != "cpu":
        # the share the prediction's KV pool was sized at (vLLM's default, or --gpu-memory-utilization), so the
        # server that starts holds the pool predicted; without a pool, the need plus 2%
        pool = getattr(e, "serving", None) or {}
        share = pool.get("gpu_memory_utilization") or gpu_memory_utilization(e.values["total_bytes"], e.device_count,
                                                                              e.device.memory_gib)
        parts.append(f"--gpu-memory-utilization {share:.2f}")
    if e.device_count > 1:
        parts.append(f"--tensor-parallel-size {e.device_count}")
    if e.batch > 1:
        parts.append(f"--max-num-seqs {e.batch}")
    if quant in _VLLM_QUANT_FLAG and not (quant in ("AWQ", "GPTQ") and m.hf_id):
        parts.append(f"--quantization {_VLLM_QUANT_FLAG[quant]}")
    if e.kv_dtype == "fp8":
        parts.append("--kv-cache-dtype fp8")
    if e.verdict == "needs offload":
        over = max(0.0, e.values["total_bytes"] - e.values["usable_bytes"] * 0.92)
        parts.append(f"--cpu-offload-gb {math.ceil(over / 1e9)}")
    if e.offload_fraction > 0:
        parts.append(f"--cpu-offload-gb {math.ceil(e.offload_fraction * e.values['weights_total_bytes'] / 1e9)}")
    if unrecorded:  # nothing to copy and run: no repository of that format is recorded for the model
        return f"# {' '.join(parts)}  (no {quant} checkpoint of {m.hf_id} is recorded: put the one you serve in its place)"
    return " ".join(parts)


def launch_commands(est: Estimate, predict: Callable[..., Estimate]) -> dict[str, str]:
    """Both engines' commands; the vLLM one comes from a sibling vLLM prediction (``predict``: the function that
    made ``est``, passed in so that this module does not import its caller) when needed."""
    from predictor.errors import BenchcalError

    vllm_est = None
    if est.engine != "vllm" and "vllm" in est.device.engines:
        q = _VLLM_EQUIVALENT.get(est.quant.id, "BF16")
        kv = "fp8" if est.kv_dtype in ("q8_0", "q4_0", "fp8") else None
        try:
            vllm_est = predict(
                est.model, est.device, q, est.context, "vllm", prompt_tokens=est.prompt_tokens,
                batch=est.batch, kv_dtype=kv, device_count=est.device_count,
                host_bandwidth_gbs=est.host_bandwidth_gbs, launch=False,
            )
        except BenchcalError:
            vllm_est = None
    commands = {"llama_cpp": llama_cpp_command(est), "vllm": vllm_command(est, vllm_est), "ollama": ollama_command(est)}
    if vllm_est is not None:
        commands["vllm_quant"] = vllm_est.quant.id
    return commands
