"""How a model's weights are sized for a format and an engine.

The exact bytes of the model's own GGUF file; for llama.cpp quantization mixes, the file llama-quantize writes
(``predictor.gguf_layout``); for an unquantized GGUF of a checkpoint whose experts are MXFP4 (gpt-oss), those
experts kept beside 16-bit other weights; else the format's average width (``predictor/data/quants.json``).
"""

from __future__ import annotations

from predictor import memory as mem
from predictor.architecture import ModelArch
from predictor.errors import BenchcalError
from predictor.gguf_layout import planned_weights_bytes
from predictor.quants import QuantFormat, resolve_quant

WEIGHTS_FROM_FILE = "GGUF file"
WEIGHTS_FROM_PLAN = "llama-quantize tensor types"
WEIGHTS_FROM_WIDTH = "average width"
WEIGHTS_FROM_NATIVE_EXPERTS = "MXFP4 experts kept"
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
    if engine == "llama.cpp" and arch.expert_format == "MXFP4" and quant.id in _UNQUANTIZED:
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
    if engine == "llama.cpp":
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
