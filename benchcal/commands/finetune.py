"""``benchcal finetune``: memory of QLoRA, LoRA and full fine-tuning of a model, and the GPU that holds it."""

from __future__ import annotations

import argparse

from benchcal.argtypes import output_file, positive_int
from benchcal.commands.predict import emit
from benchcal.reports.finetune import finetune_report
from benchcal.reports.render import FORMATS, render
from predictor.devices import load_devices, resolve_device
from predictor.errors import BenchcalError
from predictor.finetune import ADAPTER_DTYPES, METHODS, OPTIMIZERS, FinetuneSetup
from predictor.models import resolve_model


def cmd_finetune(args) -> int:
    arch = resolve_model(args.model)
    device = None
    if args.gpu:
        if args.gpu.strip().lower() == "cpu":
            raise BenchcalError("--gpu cpu: fine-tuning memory is sized for a GPU; give a device id (l4, h100-sxm)")
        device = resolve_device(args.gpu)
    methods = [args.method] if args.method else list(METHODS)
    setups = [FinetuneSetup(method=m, seq_len=args.seq, batch=args.batch, lora_rank=args.lora_rank,
                            gradient_checkpointing=not args.no_gradient_checkpointing,
                            optimizer=args.optimizer if args.method else None, adapter_dtype=args.adapter_dtype,
                            gpus=args.gpus).validated() for m in methods]
    emit(render(finetune_report(arch, setups, load_devices(), device), args.format), args)
    return 0


def register(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tuning memory: QLoRA, LoRA, full; verdict and recommended GPU",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  benchcal finetune --model llama-3.1-8b --gpu rtx-4090\n"
                              "  benchcal finetune --model qwen2.5-72b --method qlora --seq 4096 --format json")
    p.add_argument("--model", required=True, help="catalogue id, HF id, config.json, HF dir or .gguf")
    p.add_argument("--method", choices=METHODS, default=None, help="qlora, lora or full (default: all three)")
    p.add_argument("--gpu", default=None, help="device to judge the fit on (default: none; a GPU is recommended "
                   "either way)")
    p.add_argument("--seq", type=positive_int, default=2048, help="training sequence length, tokens (default 2048)")
    p.add_argument("--batch", type=positive_int, default=1, help="per-device micro-batch (default 1)")
    p.add_argument("--lora-rank", type=positive_int, default=16, help="LoRA rank r (default 16)")
    p.add_argument("--no-gradient-checkpointing", action="store_true", help="keep every block's activations "
                   "(default: gradient checkpointing on, as QLoRA and most recipes train)")
    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default=None, help="with --method: optimizer (default: "
                   "paged-adamw-32bit for qlora, adamw for lora and full)")
    p.add_argument("--adapter-dtype", choices=tuple(ADAPTER_DTYPES), default="fp32", help="LoRA adapter weights and "
                   "gradients: fp32 (PEFT's default) or bf16 (QLoRA's own script)")
    p.add_argument("--gpus", type=positive_int, default=1, help="GPUs the states are sharded over (FSDP / ZeRO-3; "
                   "default 1)")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    p.add_argument("--output", "-o", type=output_file, default=None, help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_finetune)
