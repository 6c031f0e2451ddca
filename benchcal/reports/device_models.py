"""Which models run on one device: the calculators' "other models on this hardware", for the whole catalogue.

Every catalogue model is predicted on the device as ``benchcal predict`` predicts it (:func:`predictor.estimate.predict`,
the same coefficients), in the format asked for or the model's default one, at the context asked for (capped at the
model's own maximum). A model that needs offload shows the speed of the configuration that runs (the most layers that
fit on the device), as ``predict`` does; one that does not fit shows no speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchcal.reports.render import Report
from predictor.architecture import ModelArch
from predictor.coefficients import Coefficients
from predictor.devices import Device
from predictor.errors import BenchcalError
from predictor.estimate import VERDICTS, predict
from predictor.quants import default_format

MODEL_FIELDS = ("id", "name", "params_b", "active_params_b", "architecture", "attention", "layers", "max_context")


def model_fields(m: ModelArch) -> dict[str, Any]:
    """The catalogue listing's fields of one model (``benchcal models``)."""
    return {"id": m.id, "name": m.name, "params_b": round(m.params_total / 1e9, 2),
            "active_params_b": round(m.params_active / 1e9, 2), "architecture": m.architecture,
            "attention": m.attention_kind.upper() + (" MoE" if m.num_experts else ""), "layers": m.num_layers,
            "max_context": m.max_context}


def _on_device(m: ModelArch, device: Device, engine: str, context: int, quant: str | None, prompt_tokens: int,
               table: Coefficients | str) -> dict[str, Any]:
    """One model's prediction on the device: format, context, verdict, memory, decode and TTFT of what runs."""
    fmt = quant or default_format(m, engine)
    ctx = min(int(context), int(m.max_context))
    try:
        d = predict(m, device, fmt, ctx, engine, prompt_tokens=min(prompt_tokens, ctx), coefficients=table,
                    launch=False).to_dict()
    except BenchcalError as exc:  # a format this model cannot take (an AWQ build nobody publishes, say)
        return {"quant": fmt, "context": ctx, "status": "not predicted", "reason": str(exc)}
    fit, tp = d["fit"], d["throughput"]
    runs = fit["verdict"] in ("fits", "tight", "needs offload")
    return {
        "quant": d["quant"], "context": ctx, "status": fit["verdict"],
        "total_gib": d["memory"]["total_gib"], "usable_gib": d["gpu"]["usable_gib"],
        "decode_tok_s": tp["decode_tok_s"] if runs else None, "ttft_s": round(tp["ttft_ms"] / 1000.0, 4) if runs else None,
        "offload_fraction": tp["offload_fraction"] if fit["verdict"] == "needs offload" else 0.0,
        "max_safe_context": fit["max_context"] or None,
    }


def device_models_report(models: Sequence[ModelArch], device: Device, engine: str, context: int,
                         quant: str | None = None, *, prompt_tokens: int = 4096,
                         table: Coefficients | str = "default") -> Report:
    """Every catalogue model on ``device``: fits first, then tight, needs offload and does not fit; within each,
    the largest model first."""
    rows = []
    for m in models:
        rows.append({**model_fields(m), **_on_device(m, device, engine, context, quant, prompt_tokens, table)})
    rank = {v: i for i, v in enumerate(VERDICTS)}
    rows.sort(key=lambda r: (rank.get(r["status"], len(VERDICTS)), -r["params_b"]))
    running = sum(r["status"] in ("fits", "tight") for r in rows)
    rep = Report(
        title=f"Models on {device.name} — {engine}, {context:,} context",
        subtitle=(f"{len(rows)} catalogue models, {running} of them held by the device; each "
                  f"{'in ' + quant if quant else 'in its default format'}, at {context:,} tokens of context or its "
                  f"own maximum where lower; decode at batch 1, TTFT for a {prompt_tokens:,}-token prompt (or the "
                  "context); a model that needs offload runs with the most layers that fit on the device."),
        data=rows,
    )
    table_rows = []
    for r in rows:
        speed = "—" if r.get("decode_tok_s") is None else f"{r['decode_tok_s']:.1f}"
        if r["status"] == "needs offload" and r.get("decode_tok_s") is not None:
            speed += " (offload)"
        table_rows.append([
            r["name"], f"{r['params_b']:g}", r["quant"], r["status"],
            "—" if r.get("total_gib") is None else f"{r['total_gib']:.1f} / {r['usable_gib']:.1f}", speed,
            "—" if r.get("ttft_s") is None else f"{r['ttft_s']:.2f}",
            "—" if not r.get("max_safe_context") else f"{r['max_safe_context']:,}"])
    rep.add("Models", "table", table_rows, ["Model", "Params B", "Format", "Status", "Total / usable GiB",
                                            "Decode tok/s", "TTFT s", "Max safe ctx"])
    rep.sections[-1].interactive = True
    return rep
