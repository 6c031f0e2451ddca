"""Fine-tuning memory (predictor/finetune.py, `benchcal finetune`): the formulas against what can be checked.

- Activations: the bytes autograd saves in a training forward of transformers' Llama, counted here on a
  configuration the constants were not read from (benchmarks/finetune_activations.py holds the ones they were).
- LoRA adapters: r x (d_in + d_out) over the seven projections of Llama 3.1 8B at r = 16 is 41,943,040, the count
  PEFT's ``print_trainable_parameters`` reports for that model and rank.
- QLoRA's own claims (https://arxiv.org/abs/2305.14314): its Guanaco 65B recipe
  (https://github.com/artidoro/qlora/blob/86ac6016f66a84faa4b626e9cdac0fc6be992f19/scripts/finetune_guanaco_65b.sh:
  r 64 on all linear layers, NF4 with double quantization, gradient checkpointing, batch 1, at most 16 + 512
  tokens, paged AdamW 32-bit, adapters in BF16) fits "a single 48GB GPU"; regular 16-bit fine-tuning of the 65B
  model "requires more than 780 GB".
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from predictor.devices import load_devices, resolve_device
from predictor.finetune import (
    FinetuneSetup,
    adapter_params,
    finetune_memory,
    gpus_needed,
    recommend_devices,
    usable_bytes,
)
from predictor.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchcal", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_lora_adapters_on_the_seven_projections_of_llama_3_1_8b():
    assert adapter_params(resolve_model("llama-3.1-8b"), 16) == 41_943_040


def test_guanaco_65b_recipe_fits_a_48_gb_gpu_and_16_bit_fine_tuning_needs_more_than_780_gb():
    llama = resolve_model("llama-65b")
    guanaco = FinetuneSetup("qlora", seq_len=16 + 512, batch=1, lora_rank=64, gradient_checkpointing=True,
                            optimizer="paged-adamw-32bit", adapter_dtype="bf16")
    total = finetune_memory(llama, guanaco).total
    a6000 = usable_bytes(resolve_device("rtx-a6000"))  # 48 GB
    assert 40 * GIB < total <= a6000
    assert finetune_memory(llama, FinetuneSetup("full", seq_len=528)).total > 780e9


def test_components_follow_the_method():
    arch = resolve_model("llama-3.1-8b")
    full = finetune_memory(arch, FinetuneSetup("full"))
    lora = finetune_memory(arch, FinetuneSetup("lora"))
    qlora = finetune_memory(arch, FinetuneSetup("qlora"))
    # mixed precision: 2 + 4 (master) + 4 (gradients) + 8 (AdamW) bytes per parameter
    assert full.base_weights + full.master_weights + full.gradients + full.optimizer == pytest.approx(
        18 * arch.params_total)
    assert lora.base_weights == pytest.approx(2 * arch.params_total) and lora.master_weights == 0
    assert qlora.base_weights < 0.4 * lora.base_weights
    assert qlora.activations == lora.activations == full.activations
    eight = finetune_memory(arch, FinetuneSetup("full", gpus=8))
    assert eight.optimizer == pytest.approx(full.optimizer / 8) and eight.activations == full.activations
    no_ckpt = finetune_memory(arch, FinetuneSetup("lora", gradient_checkpointing=False))
    assert no_ckpt.activations > 4 * lora.activations  # the FP32 logits (128K vocabulary) stay either way


def test_recommendation_holds_the_run_and_shards_when_no_card_does():
    arch = resolve_model("qwen2.5-72b")
    devices = load_devices()
    rec = recommend_devices(arch, FinetuneSetup("qlora"), devices)
    device = resolve_device(rec["device"])
    assert rec["gpus"] == 1 and finetune_memory(arch, FinetuneSetup("qlora")).total <= usable_bytes(device)
    full = recommend_devices(arch, FinetuneSetup("full"), devices)
    assert full["gpus"] > 1
    assert gpus_needed(arch, FinetuneSetup("full"), usable_bytes(resolve_device(full["device"]))) == full["gpus"]


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch and transformers")
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_formula_matches_what_autograd_saves(checkpointing):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from finetune_activations import formula_bytes, llama_config, saved_bytes

    config = llama_config(320, 896, 5, 1, 2, 1500)  # not one of the benchmark's configurations
    measured = saved_bytes(config, 96, checkpointing)
    _, seen = formula_bytes(config, 96, checkpointing)
    assert seen == pytest.approx(measured, rel=0.03)


def test_finetune_command_json_is_numbers_and_every_format_renders():
    p = run("finetune", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    methods = {m["method"]: m for m in data["methods"]}
    assert set(methods) == {"qlora", "lora", "full"}
    assert methods["qlora"]["fits"] is True and methods["full"]["fits"] is False
    for m in methods.values():
        assert all(isinstance(v, float) for v in m["memory_gib"].values())
        assert resolve_device(m["recommended"]["device"])
    for fmt in ("table", "md", "html"):
        out = run("finetune", "--model", "qwen2.5-7b", "--method", "qlora", "--format", fmt)
        assert out.returncode == 0 and "NaN" not in out.stdout and "Base weights" in out.stdout, fmt


@pytest.mark.parametrize("args, message", [
    (["--gpu", "cpu"], "sized for a GPU"),
    (["--gpu", "no-such-gpu"], "no-such-gpu"),
    (["--seq", "0"], "--seq"),
    (["--method", "dora"], "--method"),
])
def test_bad_finetune_input_is_one_line_and_exit_2(args, message):
    p = run("finetune", "--model", "llama-3.1-8b", *args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and message in p.stderr
    assert "Traceback" not in p.stderr


def test_predict_reports_fine_tuning_on_its_device():
    p = run("predict", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--format", "json")
    assert p.returncode == 0, p.stderr
    finetune = json.loads(p.stdout)["finetune"]
    fits = {m["method"]: m["fits"] for m in finetune["methods"]}
    assert fits == {"qlora": True, "lora": True, "full": False}
    table = run("predict", "--model", "llama-3.1-8b", "--gpu", "rtx-4090").stdout
    assert "Fine-tuning memory" in table and "benchcal finetune --model llama-3.1-8b" in table
