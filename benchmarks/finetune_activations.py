"""Activation memory of a training step, measured: the bytes autograd keeps for the backward pass in one training
forward of transformers' ``LlamaForCausalLM`` (random weights, BF16, PyTorch's SDPA attention, labels given so the
loss runs), counted with ``torch.autograd.graph.saved_tensors_hooks`` (each saved tensor's storage once, parameters
left out), against :func:`predictor.finetune.activation_bytes_per_token`'s formula for the same configuration.

The formula's per-token constants (``ACT_HIDDEN_BYTES`` and the others in :mod:`predictor.finetune`) come from these
counts. The formula also holds what no forward hook sees: the FP32 logits' gradient (4 B x vocab per token) at the
start of the backward pass and, with gradient checkpointing, the one block recomputed at a time during it. Prints one
JSON line per configuration: the measured bytes, the formula's, and their ratio with those two terms left out.

Usage::

    python benchmarks/finetune_activations.py [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# hidden, FFN width, heads, KV heads, blocks, vocabulary
CONFIGS = [
    (256, 704, 8, 2, 2, 1000),
    (256, 704, 8, 2, 4, 1000),
    (512, 704, 16, 4, 2, 1000),
    (256, 1408, 8, 2, 2, 1000),
    (256, 704, 8, 8, 2, 1000),
    (256, 704, 8, 2, 2, 4000),
    (384, 1024, 6, 2, 3, 2048),
]


def llama_config(hidden: int, ffn: int, heads: int, kv_heads: int, layers: int, vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": ffn, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}


def saved_bytes(config: dict, seq: int, gradient_checkpointing: bool) -> int:
    """Bytes of the distinct storages autograd saves in one training forward of ``config`` over ``seq`` tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).to(torch.bfloat16)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    ids = torch.randint(0, config["vocab_size"], (1, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def formula_bytes(config: dict, seq: int, gradient_checkpointing: bool) -> tuple[float, float]:
    """(the formula's bytes, the part a forward count can see: without the logits' gradient and, checkpointed,
    without the block recomputed during the backward pass)."""
    from predictor.architecture import from_hf_config
    from predictor.finetune import activation_bytes_per_token, block_activation_bytes

    arch = from_hf_config(config, id="measured", source="benchmarks/finetune_activations.py")
    total = activation_bytes_per_token(arch, gradient_checkpointing) * seq
    unseen = 4.0 * config["vocab_size"] * seq
    if gradient_checkpointing:
        unseen += block_activation_bytes(arch) * seq
    return total, total - unseen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    for dims in CONFIGS:
        config = llama_config(*dims)
        for checkpointing in (False, True):
            measured = saved_bytes(config, args.seq, checkpointing)
            formula, seen_part = formula_bytes(config, args.seq, checkpointing)
            print(json.dumps({"hidden": dims[0], "ffn": dims[1], "heads": dims[2], "kv_heads": dims[3],
                              "layers": dims[4], "vocab": dims[5], "seq": args.seq,
                              "gradient_checkpointing": checkpointing, "measured_bytes": measured,
                              "formula_bytes": round(formula), "formula_seen_part_over_measured":
                              round(seen_part / measured, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
