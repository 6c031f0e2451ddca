"""How a model's weights are sized for a format and an engine.

The exact bytes of the model's own GGUF file; for llama.cpp quantization mixes, the file llama-quantize writes
(``predictor.gguf_layout``); for an unquantized GGUF of a checkpoint whose experts are MXFP4 (gpt-oss), those
experts kept beside 16-bit other weights; for a format that quantizes the linear layers only (vLLM's AWQ, GPTQ,
FP8), the input embedding and LM head at their own width; else the format's average width
(``predictor/data/quants.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from predictor import memory as mem
from predictor.architecture import ModelArch
from predictor.engines import traits
from predictor.errors import BenchcalError
from predictor.gguf_layout import layout_spec, planned_weights_bytes, tensor_plan
from predictor.quants import QuantFormat, resolve_quant

WEIGHTS_FROM_FILE = "GGUF file"
WEIGHTS_FROM_PLAN = "llama-quantize tensor types"
WEIGHTS_FROM_WIDTH = "average width"
WEIGHTS_FROM_NATIVE_EXPERTS = "MXFP4 experts kept"
WEIGHTS_FROM_WIDE_EMBEDDINGS = "16-bit embeddings and LM head"
# Formats a checkpoint is converted to without quantizing: published F16 GGUFs of gpt-oss keep the checkpoint's
# MXFP4 experts (gpt-oss-20b from two sources: 13.8 GB, not 2 bytes x 20.9B parameters).
_UNQUANTIZED = frozenset({"F32", "F16", "BF16"})


def format_bits(arch: ModelArch, quant: QuantFormat, engine: str) -> tuple[float | None, float | None]:
    """(bits per expert weight, bits per other weight or None when both are the format's width).

    A llama.cpp GGUF in an unquantized format of a checkpoint whose experts are MXFP4 (gpt-oss) keeps the
    experts in MXFP4; the rest takes the format's width. Quantized mixes of such a model depend on how the
    file was made (llama-quantize refuses to requantize MXFP4 tensors without ``--allow-requantize``; some
    publishers keep the experts with ``--tensor-type`` overrides, others requantize them): the format's width.
    """
    if traits(engine).gguf and arch.expert_format == "MXFP4" and quant.id in _UNQUANTIZED:
        return resolve_quant("MXFP4").bits_per_weight, quant.bits_per_weight
    return quant.bits_per_weight, quant.bits_per_weight_non_expert


def known_weights_bytes(arch: ModelArch, quant: QuantFormat, engine: str) -> tuple[float | None, str]:
    """The weights' tensor bytes where known beyond the format's average width, and how they are known:
    the model's own GGUF file, (llama.cpp) the tensor types llama-quantize gives each of its weights, or the
    checkpoint's MXFP4 experts kept beside unquantized other weights (:func:`format_bits`)."""
    if arch.weights_bytes_exact and arch.weights_quant == quant.id:
        return float(arch.weights_bytes_exact), WEIGHTS_FROM_FILE
    expert_bits, other_bits = format_bits(arch, quant, engine)
    if other_bits is not None and quant.bits_per_weight_non_expert is None:
        return float(mem.weights_bytes(arch, expert_bits, other_bits)), WEIGHTS_FROM_NATIVE_EXPERTS
    if quant.embedding_bits is not None and quant.bits_per_weight is not None and not traits(engine).gguf:
        wide = arch.params_embedding + (arch.params_output or 0)  # a tied LM head is the embedding table itself
        narrow = arch.params_total - wide
        return (narrow * quant.bits_per_weight + wide * quant.embedding_bits) / 8.0, WEIGHTS_FROM_WIDE_EMBEDDINGS
    if traits(engine).gguf:
        planned = planned_weights_bytes(arch, quant.id)
        if planned is not None:
            # The plan is the language model's file; parameters outside it (Gemma 3's vision tower, in
            # params_total) keep the file's average width, as every part of a model does without a plan.
            return float(planned) * arch.params_total / (arch.params_total - arch.params_extra), WEIGHTS_FROM_PLAN
    return None, WEIGHTS_FROM_WIDTH


def weights_bits_per_weight(arch: ModelArch, quant: QuantFormat, weights_total_bytes: float,
                            source: str) -> float | None:
    """Bits per weight: the format's average width, or the file's or llama-quantize plan's own average
    (more than the format's where the output layer and some layers keep more bits)."""
    if source == WEIGHTS_FROM_WIDTH:
        return quant.bits_per_weight
    return round(weights_total_bytes * 8.0 / arch.params_total, 3)


def require_bits(quant: QuantFormat, exact_weights_bytes: float | None) -> None:
    """A per-model mix (UD-Q2_K_XL) has no fixed bits per weight: only a GGUF file can size it."""
    if quant.bits_per_weight is None and exact_weights_bytes is None:
        raise BenchcalError(f"{quant.id} is a per-model mix with no fixed bits per weight: pass its GGUF file as --model")


# llama.cpp's CPU backend repacks these tensor types into interleaved layouts for its GEMM kernels (x86 AVX2 /
# AVX-512, Arm): the CPU_REPACK buffer of a run holds exactly the layer matrices of these types (Qwen2.5-0.5B
# Q4_K_M: its 12 Q4_K tensors, 28.05 MiB, as the run's log says; Q4_0: all 168, 191.95 MiB).
CPU_REPACKED_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL"})
# Multiplied by llamafile's tinyBLAS GEMM (F16/BF16/F32 weights), the path the host matmul probe measures.
CPU_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
# Q8_0's dot product, the simplest of the generic path's (no sub-block scales or high bits to unpack).
CPU_Q8_TYPES = frozenset({"Q8_0"})


@dataclass(frozen=True)
class CpuKernelMix:
    """How llama.cpp's CPU backend multiplies a model's layer matrices: shares of their bytes and weights that
    it repacks (``repacked_*``), that go through its float GEMM (``float_weights``), that are Q8_0
    (``q8_weights``); the rest take its generic quantized dot products (Q5_0, Q6_K, ...)."""

    repacked_bytes: float
    repacked_weights: float
    float_weights: float
    q8_weights: float = 0.0
    generic_bytes: float = 0.0  # share of the bytes on the generic dot products (neither repacked, float nor Q8_0)

    @property
    def generic_weights(self) -> float:
        return max(0.0, 1.0 - self.repacked_weights - self.float_weights - self.q8_weights)


def _layer_matrices(arch: ModelArch, quant_id: str) -> list | None:
    """The layer matrices of llama-quantize's plan of ``arch`` in ``quant_id`` (norms and biases are vectors; a MoE
    router is a small F32 matrix it keeps), or None where the layout is not planned."""
    spec = layout_spec(arch)
    if spec is None:
        return None
    try:
        plan = tensor_plan(spec, quant_id)
    except BenchcalError:
        return None
    return [t for t in plan if t.name.startswith("blk.") and len(t.shape) >= 2 and "ffn_gate_inp" not in t.name]


@lru_cache(maxsize=256)
def cpu_kernel_mix(arch: ModelArch, quant_id: str) -> CpuKernelMix:
    """The CPU kernel mix of ``arch`` in ``quant_id``: from the tensor types llama-quantize gives each layer
    matrix where the layout is planned (``predictor.gguf_layout``), else from the format as a whole."""
    layers = _layer_matrices(arch, quant_id)
    if layers is None:
        repacked = quant_id in mem.CPU_REPACKED_QUANTS
        floating = quant_id in _UNQUANTIZED
        q8 = quant_id in CPU_Q8_TYPES
        generic = float(not (repacked or floating or q8))
        return CpuKernelMix(float(repacked), float(repacked), float(floating), float(q8), generic)
    total_bytes = sum(t.nbytes for t in layers) or 1
    total_values = sum(t.n_values for t in layers) or 1
    repacked = [t for t in layers if t.ggml_type in CPU_REPACKED_TYPES]
    floating = [t for t in layers if t.ggml_type in CPU_FLOAT_TYPES]
    q8 = [t for t in layers if t.ggml_type in CPU_Q8_TYPES]
    special = CPU_REPACKED_TYPES | CPU_FLOAT_TYPES | CPU_Q8_TYPES
    generic = [t for t in layers if t.ggml_type not in special]
    return CpuKernelMix(sum(t.nbytes for t in repacked) / total_bytes, sum(t.n_values for t in repacked) / total_values,
                        sum(t.n_values for t in floating) / total_values, sum(t.n_values for t in q8) / total_values,
                        sum(t.nbytes for t in generic) / total_bytes)


# llama.cpp's K-quant types below 4 bits (ggml-common.h: block_q2_K, block_q3_K): 2- and 3-bit values in 16-value
# sub-blocks with 4- or 6-bit scales, and Q3_K's high bits in a separate mask, which its matrix-vector kernels
# unpack for every weight of a decode step. The files llama-quantize writes as Q2_K and Q3_K_S/M/L hold mostly these.
LOW_BIT_KQUANT_TYPES = frozenset({"Q2_K", "Q3_K"})
_LOW_BIT_KQUANT_FILES = frozenset({"Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L"})


@lru_cache(maxsize=256)
def low_bit_kquant_share(arch: ModelArch, quant_id: str) -> float:
    """Share of the layer matrices' weights in Q2_K or Q3_K tensors: from llama-quantize's tensor types where the
    layout is planned, else 1 for a Q2_K or Q3_K_* file and 0 for any other."""
    layers = _layer_matrices(arch, quant_id)
    if layers is None:
        return float(quant_id in _LOW_BIT_KQUANT_FILES)
    total = sum(t.n_values for t in layers) or 1
    return sum(t.n_values for t in layers if t.ggml_type in LOW_BIT_KQUANT_TYPES) / total


def kernel_kwargs(arch: ModelArch, quant_id: str) -> dict[str, float]:
    """``predictor.estimate.evaluate``'s kernel-mix arguments for a model in a format: the CPU's
    (:func:`cpu_kernel_mix`) and the share of low-bit K-quant weights (:func:`low_bit_kquant_share`)."""
    mix = cpu_kernel_mix(arch, quant_id)
    return {"cpu_repack": mix.repacked_bytes, "cpu_repack_weights": mix.repacked_weights,
            "cpu_float_weights": mix.float_weights, "cpu_q8_weights": mix.q8_weights,
            "cpu_generic_bytes": mix.generic_bytes, "kquant_low_weights": low_bit_kquant_share(arch, quant_id)}
