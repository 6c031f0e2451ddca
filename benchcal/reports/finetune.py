"""The fine-tuning memory report: QLoRA / LoRA / full side by side, each component with its formula, a verdict on
the device asked for and the GPU that holds it (:mod:`predictor.finetune`)."""

from __future__ import annotations

from collections.abc import Sequence

from benchcal.reports.render import Report
from predictor.architecture import ModelArch
from predictor.devices import Device
from predictor.finetune import (
    METHOD_LABELS,
    SOURCES,
    FinetuneSetup,
    finetune_memory,
    gib,
    recommend_devices,
    usable_bytes,
)

COMPONENTS = (("base_weights", "Base weights"), ("master_weights", "FP32 master weights"), ("adapters", "LoRA adapters"),
              ("gradients", "Gradients"), ("optimizer", "Optimizer states"), ("activations", "Activations"),
              ("runtime", "Runtime"))


def finetune_report(arch: ModelArch, setups: Sequence[FinetuneSetup], devices: Sequence[Device],
                    device: Device | None = None) -> Report:
    first = setups[0].validated()
    rep = Report(title=f"Fine-tuning memory — {arch.name}",
                 subtitle=f"{first.seq_len:,} tokens x batch {first.batch}, "
                          f"{'gradient checkpointing' if first.gradient_checkpointing else 'no gradient checkpointing'}"
                          + (f", {first.gpus} GPUs sharded" if first.gpus > 1 else "")
                          + (f", on {device.name}" if device else ""))
    usable = usable_bytes(device) if device else None
    methods, rows = [], []
    for setup in setups:
        mem = finetune_memory(arch, setup)
        s = mem.setup
        recommended = recommend_devices(arch, FinetuneSetup(**{**s.__dict__, "gpus": 1}), devices)
        fits = None if usable is None else bool(mem.total <= usable)
        methods.append({
            "method": s.method, "label": METHOD_LABELS[s.method], "optimizer": s.optimizer,
            "adapter_dtype": s.adapter_dtype if s.method != "full" else None,
            "lora_rank": s.lora_rank if s.method != "full" else None,
            "trainable_params": mem.trainable_params, "memory_gib": mem.as_gib(), "formulas": mem.formulas,
            "fits": fits, "recommended": recommended,
        })
        rec = "—" if recommended is None else (
            f"{recommended['gpus']}x {recommended['name']}" if recommended["gpus"] > 1 else recommended["name"])
        trainable = mem.adapters + mem.gradients + mem.optimizer + mem.master_weights
        row = [METHOD_LABELS[s.method], gib(mem.base_weights), gib(trainable), gib(mem.activations), gib(mem.total)]
        if device:
            row.append("fits" if fits else "does not fit")
        rows.append(row + [rec])
    columns = ["Method", "Base weights GiB", "Trainable state GiB", "Activations GiB", "Total GiB"]
    if device:
        columns.append(f"On {device.name} ({gib(usable):.1f} GiB usable)")
    rep.add("Methods", "table", rows, columns + ["Recommended GPU"],
            note="Trainable state: adapters, gradients, optimizer states and, for full fine-tuning, the FP32 master "
                 "weights. Recommended: the cheapest discrete GPU that holds it (catalogue prices; sharded over "
                 "2, 4 or 8 of one card where none holds it alone).")
    for entry in methods:
        mem = entry["memory_gib"]
        rep.add(f"Breakdown — {entry['label']}", "table",
                [[label, mem[key], entry["formulas"].get(key, "not applicable to this method")]
                 for key, label in COMPONENTS if mem[key] or key in entry["formulas"]] + [["Total", mem["total"], ""]],
                ["Component", "GiB", "Formula"])
    rep.add("Sources", "kv", [[k, v] for k, v in SOURCES.items()])
    rep.data = {
        "model": arch.id, "device": device.id if device else None,
        "usable_gib": gib(usable) if usable is not None else None,
        "seq_len": first.seq_len, "batch": first.batch, "gradient_checkpointing": first.gradient_checkpointing,
        "gpus": first.gpus, "methods": methods, "sources": SOURCES,
    }
    return rep
