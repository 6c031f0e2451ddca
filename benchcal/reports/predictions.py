"""Report builders: the fit report, context scaling, quantization matrix, hardware leaderboard,
recommendations and catalogue listings — the content the public calculators show, from our model.

Each builder returns a :class:`benchcal.reports.render.Report`; ``render`` formats it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from benchcal.reports.render import Chart, Report
from predictor import memory as mem
from predictor.architecture import ModelArch
from predictor.coefficients import Coefficients
from predictor.devices import Device, load_devices
from predictor.engines import traits
from predictor.estimate import GIB, VERDICTS, Estimate, offload_that_runs, predict
from predictor.evidence import admits, device_evidence
from predictor.finetune import (
    METHOD_LABELS,
    METHODS,
    FinetuneSetup,
    finetune_memory,
    recommend_devices,
    usable_bytes,
)
from predictor.grid import sweep_scenario
from predictor.load import max_concurrency
from predictor.memory import tensor_parallel_refusal
from predictor.prices import CloudOffer, cheapest_rental, cloud_offers
from predictor.quants import (
    QuantFormat,
    default_format,
    normalize_engine,
    quality_tier,
    quant_formats,
    quantized_kv,
    resolve_kv_dtype,
    resolve_quant,
)
from predictor.registry import REGISTRY
from predictor.scenario import Scenario, scenario_arch
from predictor.weights import (
    WEIGHTS_FROM_WIDTH,
    format_bits,
    known_weights_bytes,
    require_bits,
    weights_bits_per_weight,
)

# recommend's picks: what each optimizes (its JSON ``pick``) and how it is shown
PICKS = {"cheapest_gpu": "Cheapest single GPU that fits", "best_value": "Most tok/s per dollar",
         "cheapest_unified": "Cheapest unified memory that fits", "cheapest_multi_gpu": "Cheapest multi-GPU rig that fits",
         "fastest": "Fastest that fits", "cheapest_cloud": "Cheapest cloud rental that fits"}
EVIDENCE_NOTE = ("Evidence: measured (runs of this device, engine, backend and format family in the fit), family "
                 "(of its family, or of the device in another format), prior (the physics prior), extrapolated "
                 "(nothing fitted describes it); the band is the cross-validated p90 error at that level.")
STANDARD_CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
MATRIX_QUANTS = ("BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K", "UD-Q2_K_XL")
VLLM_MATRIX_QUANTS = ("BF16", "FP8", "AWQ", "GPTQ")


def _gib(x: float) -> float:
    return round(float(x) / GIB, 2)


def _not_in_catalogue(gpu: dict) -> str:
    """What a throughput cell says when the device's catalogue entry lacks the figure it needs."""
    figure = "bandwidth" if gpu.get("bandwidth_gbs") is None else "FLOPS"
    return f"— (no {figure} figure for this device in the catalogue)"


def _rounded(x: float, nd: int) -> float | str:
    """``x`` rounded, or a dash where the model cannot give it (a catalogue entry without FLOPS or bandwidth)."""
    return round(float(x), nd) if np.isfinite(x) else "—"


def _ctx_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def contexts_for(arch: ModelArch, start: int = 4096) -> list[int]:
    """4K, 8K, ... up to the model's maximum (the maximum itself included)."""
    out = [c for c in STANDARD_CONTEXTS if start <= c <= arch.max_context]
    if arch.max_context not in out and arch.max_context >= start:
        out.append(arch.max_context)
    return out or [arch.max_context]


def long_context_note(arch: ModelArch) -> str:
    """A sentence for a report whose context needs the RoPE scaling the model card documents; else empty."""
    rs = arch.rope_scaling
    if not (arch.long_context and rs):
        return ""
    return (f" Beyond the config's {arch.native_max_context:,} tokens: {rs.describe()}, as the model card documents "
            f"({rs.source}).")


def _evidence(table: Coefficients | None, engine: str, device: Device, quant: str) -> dict[str, Any]:
    """The evidence of a row's prediction (:func:`predictor.evidence.device_evidence`): its level, its basis and
    the band at that level, as ``predict`` names them."""
    ev = device_evidence(table or Coefficients(), engine, device, quant)
    return {"level": ev["level"], "basis": ev["basis"], "band": {k: round(v, 4) for k, v in ev["band"].items()}}


def _level(ev: dict[str, Any], quantity: str = "decode") -> str:
    band = ev["band"].get(quantity)
    return f"{ev['level']} (±{band * 100:.0f}%)" if band else ev["level"]


def _tp_kv_note(tp: dict | None) -> str:
    """The KV row's note under tensor parallelism: each rank's share and what is held on several ranks."""
    if not tp:
        return ""
    return (f" over {tp['size']} ranks, {tp['kv_cache_per_rank_gib']:.2f} GiB each ({tp['kv_split']}; "
            f"{tp['attention_heads_per_rank']} query heads a rank)")


def predict_report(est: Estimate, table: Coefficients | None = None) -> Report:
    """The fit report: breakdown, verdict, throughput, context scaling, launch commands."""
    d = est.to_dict()
    m, g, mem, fit, thr, cal = d["model"], d["gpu"], d["memory"], d["fit"], d["throughput"], d["calibration"]
    gpus = f"{g['count']}x {g['name']}" if g["count"] > 1 else g["name"]
    rep = Report(
        title=f"{m['name']} on {gpus} — {est.engine}{f' ({est.backend})' if est.backend else ''}, {est.quant.id}, "
              f"{est.context:,} context",
        subtitle=(
            f"{m['params_b']:.2f}B total, {m['active_params_b']:.2f}B active per token, "
            f"{m['architecture']} ({m['attention'].upper()}{', MoE' if m['moe'] else ''}), {m['layers']} layers; "
            f"batch {est.batch}, KV {est.kv_dtype}, flash attention {'on' if est.flash_attn else 'off'}."
        ),
        data=d,
    )
    rope = m["rope_scaling"]
    if est.model.long_context and rope:
        rep.add("Long context", "kv", [
            ["RoPE scaling", f"{rope['type']} x{rope['factor']:g} from {rope['original_max_context']:,} to "
                             f"{rope['max_context']:,} tokens (the config's maximum is {m['native_max_context']:,})"],
            ["Source", f"the model card: {rope['source']}"],
            ["Note", rope["note"] or "-"],
        ], ["Quantity", "Value"])
        rep.sections[-1].note = ("KV cache and speeds are computed at this context as at any other; the launch commands "
                                 "below enable the scaling.")
    runs_here = fit["verdict"] in ("fits", "tight") and thr["decode_tok_s"] and thr["ttft_ms"] is not None
    rep.headline = {"verdict": fit["verdict"], "required_gib": mem["total_gib"], "usable_gib": g["usable_gib"],
                    "segments": [("weights", mem["weights_gib"]), ("KV cache", mem["kv_cache_gib"]),
                                 ("runtime & buffers", mem["runtime_gib"])],
                    "simulator": {"ttft_s": thr["ttft_ms"] / 1000.0, "tok_s": thr["decode_tok_s"]} if runs_here else None}
    weights_note = f"{mem['weights_bits_per_weight']} bits/weight"
    if mem["weights_source"] != WEIGHTS_FROM_WIDTH:
        weights_note += f", {mem['weights_source']}"
    if est.model.gguf_repo and traits(est.engine).gguf and mem["weights_source"] != WEIGHTS_FROM_WIDTH:
        weights_note += f" of {est.model.gguf_repo}"  # the files its launch commands download
    rep.add("Memory", "kv", [
        ["Model weights on device", f"{mem['weights_gib']:.2f} GiB ({weights_note})"],
        ["KV cache", f"{mem['kv_cache_gib']:.2f} GiB" + _tp_kv_note(d["tensor_parallel"])],
        ["Runtime & compute buffers", f"{mem['runtime_gib']:.2f} GiB"],
        ["Offloaded to host RAM", f"{mem['offload_gib']:.2f} GiB"],
        ["Required device memory", f"{mem['total_gib']:.2f} GiB ({mem['total_gib'] * GIB / 1e9:.2f} GB)"],
        ["Usable device memory", f"{g['usable_gib']:.2f} GiB of {g['memory_gib'] * g['count']:.2f} GiB"],
        ["Headroom", f"{fit['headroom_gib']:+.2f} GiB ({fit['utilization'] * 100:.0f}% utilization)"],
        ["Verdict", fit["verdict"]],
        ["Max safe context", f"{fit['max_context']:,} tokens" if fit["max_context"] else "none without offload"],
    ], ["Quantity", "Value"])
    if fit["verdict"] == "needs offload":
        layers = est.model.num_layers
        on_gpu = min(fit["max_gpu_layers"], layers)
        rep.sections[-1].note = (
            f"Needs offload: {on_gpu} of {layers} layers fit on the device (-ngl {on_gpu}); "
            f"{fit['recommended_offload_gib']:.2f} GiB of layers and their KV stay in host RAM. "
            "The speeds below are for that configuration.")
    cost = thr["cost_per_1m_output_usd"]
    missing = _not_in_catalogue(g)
    rep.add("Throughput", "kv", [
        ["Decode (per sequence)", missing if thr["decode_tok_s"] is None
         else f"{thr['decode_tok_s']:.1f} tok/s at {thr['decode_context']:,} tokens of context"],
        ["Decode (all sequences)", missing if thr["decode_tok_s_total"] is None
         else f"{thr['decode_tok_s_total']:.1f} tok/s"],
        ["Prefill", missing if thr["prefill_tok_s"] is None else f"{thr['prefill_tok_s']:.0f} tok/s"],
        [f"TTFT ({thr['prompt_tokens']:,}-token prompt" + (f" after {thr['prompt_depth']:,} in the cache)"
                                                           if thr.get("prompt_depth") else ")"),
         missing if thr["ttft_ms"] is None else f"{thr['ttft_ms']:.0f} ms"],
        ["Cost per 1M output tokens", f"${cost:.2f} at ${g['cloud_usd_per_hour']}/h per GPU "
         f"({g['cloud_offer']['provider']}, {g['cloud_offer']['checked_at'] or 'undated'})" if cost else "— (no hourly price)"],
    ], ["Quantity", "Value"])
    serving = d.get("serving")
    if serving:
        rep.add("Serving (vLLM KV pool)", "kv", [
            ["KV pool per GPU", f"{serving['kv_pool_gib']:.2f} GiB at gpu_memory_utilization "
                                f"{serving['gpu_memory_utilization']:g}"],
            ["KV pool", f"{serving['kv_pool_tokens']:,} tokens"],
            [f"Concurrent sequences at {serving['context']:,} tokens", f"{serving['max_concurrent_sequences']:,}"],
            ["Formula", serving["formula"]],
        ], ["Quantity", "Value"])
    add_playbook_section(rep, est, table)
    add_finetune_section(rep, est)
    band = cal["error_band"]
    rep.add("Calibration", "kv", [
        ["Status", cal["status"], ""],
        ["Scope", cal["scope"] if cal["status"] != "default" else
         f"{cal['scope']} defaults (uncalibrated: the table has no {est.engine} scope for this device, or "
         "--defaults)", ""],
        ["Engine build era", cal["era"]["note"], ""],
        *([["Host", cal["note"], ""]] if cal.get("note") else []),
        ["Evidence", cal["evidence"]["level"], cal["evidence"]["basis"]],
        ["Error band", ", ".join(f"{k} ±{v * 100:.0f}%" for k, v in band.items()) or "— (uncalibrated)",
         cal.get("error_band_source") or ""],
        *[[k, f"{v:g}", cal["coefficient_sources"][k]] for k, v in cal["coefficients"].items()
          if REGISTRY[k].acts(est.engine, est.device.kind)],  # where it enters this prediction
    ], ["Coefficient", "Value", "Source"])
    # Context scaling.
    rows, xs, totals, decodes = [], [], [], []
    for ctx in contexts_for(est.model):
        e = repredict(est, table, context=ctx, prompt_tokens=ctx, prompt_depth=0)
        v = e.values
        rows.append([_ctx_label(ctx), _gib(v["kv_cache_bytes"]), _gib(v["total_bytes"]),
                     _rounded(v["decode_tok_s"], 1), _rounded(v["ttft_s"], 2), e.verdict])
        xs.append(ctx)
        totals.append(_gib(v["total_bytes"]))
        decodes.append(round(v["decode_tok_s"], 2))
    rep.add("Context scaling (prompt = context)", "table", rows,
            ["Context", "KV cache GiB", "Total GiB", "Decode tok/s", "TTFT s", "Status"])
    rep.charts.append(Chart(f"{m['name']} {est.quant.id}: memory vs context", "context (tokens)", "GiB",
                            {"required": (xs, totals)}, hline=g["usable_gib"], hline_label="usable"))
    rep.charts.append(Chart("Decode speed vs context", "context (tokens)", "tok/s", {"decode": (xs, decodes)}))
    rep.add("Launch commands", "code", [[d["launch"].get(k, "")] for k in ("llama_cpp", "vllm", "ollama")
                                        if d["launch"].get(k)])
    return rep


def repredict(est: Estimate, table: Coefficients | None = None, **changes: Any) -> Estimate:
    """``est``'s configuration predicted again with ``changes`` (``quant``, ``context``, ``prompt_tokens``,
    ``prompt_depth``, ``kv_dtype``, ``flash_attn``), every other input and the engine build as ``est`` had them; no
    launch commands."""
    args = {"quant": est.quant.id, "context": est.context, "prompt_tokens": est.prompt_tokens,
            "prompt_depth": est.prompt_depth, "kv_dtype": est.kv_dtype, "flash_attn": est.flash_attn, **changes}
    return predict(est.model, est.device, args["quant"], args["context"], est.engine,
                   prompt_tokens=args["prompt_tokens"], prompt_depth=args["prompt_depth"], batch=est.batch,
                   engine_build=est.era.get("build"),
                   kv_dtype=args["kv_dtype"], device_count=est.device_count, offload_fraction=est.offload_fraction,
                   flash_attn=args["flash_attn"], n_ubatch=est.n_ubatch, coefficients=table or "default",
                   host_bandwidth_gbs=est.host_bandwidth_gbs, launch=False)


# KV cache formats the playbook tries, per engine: (id, launch flag)
PLAYBOOK_KV = {"llama.cpp": (("q8_0", "-ctk q8_0 -ctv q8_0"), ("q4_0", "-ctk q4_0 -ctv q4_0")),
               "vllm": (("fp8", "--kv-cache-dtype fp8"),)}
PLAYBOOK_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")


def add_playbook_section(rep: Report, est: Estimate, table: Coefficients | None = None) -> None:
    """The optimisation playbook: what each change would save at this context, each figure a prediction of the
    changed configuration (``playbook`` in the JSON)."""
    base_total = est.values["total_bytes"]
    items: list[tuple[str, str, Estimate]] = []
    current_kv = resolve_kv_dtype(est.kv_dtype, est.engine).bytes_per_element
    for kv, flag in PLAYBOOK_KV.get(est.engine, ()):
        if resolve_kv_dtype(kv, est.engine).bytes_per_element < current_kv:
            # llama.cpp quantizes the V cache only with flash attention
            items.append((f"{kv} KV cache", flag + (" --flash-attn on" if est.engine == "llama.cpp" else ""),
                          repredict(est, table, kv_dtype=kv, flash_attn=True if est.engine == "llama.cpp" else est.flash_attn)))
    if est.engine == "llama.cpp":
        if est.flash_attn and quantized_kv(est.kv_dtype):  # without flash attention the V cache cannot be quantized
            items.append(("flash attention off (with an f16 KV cache)", "--flash-attn off -ctk f16 -ctv f16",
                          repredict(est, table, flash_attn=False, kv_dtype="f16")))
        else:
            items.append(("flash attention " + ("off" if est.flash_attn else "on"),
                          "--flash-attn " + ("off" if est.flash_attn else "on"),
                          repredict(est, table, flash_attn=not est.flash_attn)))
        if est.verdict not in ("fits", "tight") and est.quant.id in PLAYBOOK_QUANTS:
            for q in PLAYBOOK_QUANTS[PLAYBOOK_QUANTS.index(est.quant.id) + 1:]:
                e = repredict(est, table, quant=q)
                items.append((f"{q} weights", f"the {q} file", e))
                if e.verdict in ("fits", "tight"):
                    break
    rows, data = [], []
    for change, flag, e in items:
        saved = (base_total - e.values["total_bytes"]) / GIB
        decode = e.values["decode_tok_s"] if e.verdict in ("fits", "tight") else float("nan")
        data.append({"change": change, "flag": flag, "saves_gib": round(saved, 3),
                     "total_gib": round(e.values["total_bytes"] / GIB, 3), "verdict": e.verdict,
                     "decode_tok_s": _finite(decode, 2)})
        rows.append([change, flag, f"{saved:+.2f}" if abs(saved) >= 0.005 else "0.00",
                     round(e.values["total_bytes"] / GIB, 2), e.verdict, _rounded(decode, 1)])
    rep.data["playbook"] = data
    if rows:
        rep.add(f"Optimisation playbook (at {est.context:,} tokens of context)", "table", rows,
                ["Change", "Flag", "Saves GiB", "Total GiB", "Verdict", "Decode tok/s"],
                note="Each row is this prediction with one change; a negative saving costs memory.")


def add_finetune_section(rep: Report, est: Estimate) -> None:
    """QLoRA / LoRA / full fine-tuning of the model on this device at ``benchcal finetune``'s defaults (2,048 tokens,
    batch 1, rank 16, gradient checkpointing), as the calculators show it; ``finetune`` in the JSON (null on a
    CPU)."""
    if est.device.kind == "cpu":
        rep.data["finetune"] = None
        return
    usable = usable_bytes(est.device) * est.device_count
    devices = load_devices()
    methods, rows = [], []
    for method in METHODS:
        setup = FinetuneSetup(method, gpus=est.device_count).validated()
        mem = finetune_memory(est.model, setup)
        rec = recommend_devices(est.model, FinetuneSetup(method).validated(), devices)
        fits = bool(mem.total <= usable / est.device_count)
        methods.append({"method": method, "total_gib": round(mem.total / GIB, 3), "fits": fits,
                        "recommended": None if rec is None else {"device": rec["device"], "gpus": rec["gpus"]}})
        rec_label = "—" if rec is None else (f"{rec['gpus']}x {rec['name']}" if rec["gpus"] > 1 else rec["name"])
        rows.append([METHOD_LABELS[method], round(mem.total / GIB, 2), "fits" if fits else "does not fit", rec_label])
    rep.data["finetune"] = {"seq_len": 2048, "batch": 1, "lora_rank": 16, "gradient_checkpointing": True,
                            "gpus": est.device_count, "methods": methods}
    rep.add("Fine-tuning memory", "table", rows, ["Method", "GiB per GPU", "On this device", "Recommended GPU"],
            note="2,048 tokens, batch 1, LoRA rank 16, gradient checkpointing; every component and its formula: "
                 "benchcal finetune --model " + est.model.id)


RIG_SIZES = (2, 4, 8)


def add_rig_section(rep: Report, base: Scenario, devs: Sequence[Device], verdicts: np.ndarray, q: QuantFormat,
                    context: int, batch: int, table: Coefficients | None) -> None:
    """Multi-GPU rigs: for each discrete GPU that does not hold the model alone, the fewest of it (2, 4 or 8; layer
    split for llama.cpp, tensor parallel for vLLM) that do, with their memory per GPU, decode and TTFT (``rigs`` in
    the JSON, fastest first)."""
    left = [i for i in range(len(devs)) if VERDICTS[int(verdicts[i])] not in ("fits", "tight") and devs[i].kind == "gpu"]
    rigs = []
    for n in RIG_SIZES:
        if not left:
            break
        if traits(normalize_engine(base.engine)).tensor_parallel and tensor_parallel_refusal(scenario_arch(base), n):
            continue  # vLLM refuses this tensor-parallel size for the model
        r = sweep_scenario(base.replace(device_count=n), [devs[i] for i in left], [q], [context], [batch], table=table,
                           with_max_context=False)
        still = []
        for k, i in enumerate(left):
            v = {key: float(a[k, 0, 0, 0]) for key, a in r.items()}
            if v["verdict"] <= 1:
                d = devs[i]
                rigs.append({"device": d.id, "name": d.name, "count": n, "status": VERDICTS[int(v["verdict"])],
                             "total_gib": _finite(v["total_bytes"] / GIB, 3),
                             "usable_gib": _finite(v["usable_bytes"] / GIB, 3),
                             "decode_tok_s": _finite(v["decode_tok_s"], 2), "ttft_s": _finite(v["ttft_s"], 4),
                             "price_usd": n * d.price_usd if d.price_usd else None,
                             "cloud_usd_per_hour": _hourly(d, n), "evidence": _evidence(table, base.engine, d, q.id)})
            else:
                still.append(i)
        left = still
    rigs.sort(key=lambda x: -(x["decode_tok_s"] or 0.0))
    rep.data["rigs"] = rigs
    if rigs:
        rep.add("Multi-GPU rigs (the fewest of a card that hold the model)", "table", [
            [f"{x['count']}x {x['name']}", x["status"], f"{x['total_gib']:.1f} / {x['usable_gib']:.1f}",
             _rounded(x["decode_tok_s"], 1) if x["decode_tok_s"] is not None else "—",
             _rounded(x["ttft_s"], 2) if x["ttft_s"] is not None else "—",
             f"${x['price_usd']:,.0f}" if x["price_usd"] else "—", _level(x["evidence"])] for x in rigs],
            ["Rig", "Status", "Total / usable GiB", "Decode tok/s", "TTFT s", "Price", "Evidence (decode band)"],
            note=f"{'Layer split' if base.engine == 'llama.cpp' else 'Tensor parallel'} over the GPUs; memory is "
                 "the whole rig's; price is the cards' alone.")
        rep.sections[-1].interactive = True


def leaderboard_report(arch: ModelArch, quant: str, context: int, engine: str = "llama.cpp", *,
                       devices: Sequence[Device] | None = None, table: Coefficients | None = None,
                       prompt_tokens: int = 4096, kv_dtype: str | None = None, batch: int = 1) -> Report:
    """Every device: status, total / usable, decode, TTFT, max safe context (one vectorized pass)."""
    q = resolve_quant(quant, engine)
    kv = resolve_kv_dtype(kv_dtype or traits(engine).default_kv_dtype, engine)
    devs = [d for d in (devices or load_devices()) if engine in d.engines and d.kind != "cpu"]
    require_bits(q, known_weights_bytes(arch, q, engine)[0])
    base = Scenario(arch, engine=engine, kv_dtype=kv.id, prompt_tokens=prompt_tokens)
    r = sweep_scenario(base, devs, [q], [context], [batch], table=table)
    verdicts = r["verdict"][:, 0, 0, 0]
    offloads = {i: _offload_speed(base, devs[i], q, context, batch, table, {k: float(a[i, 0, 0, 0]) for k, a in r.items()})
                for i in range(len(devs)) if VERDICTS[int(verdicts[i])] == "needs offload"}
    speed = r["decode_tok_s"][:, 0, 0, 0].copy()
    for i, offload in offloads.items():  # the speed of the configuration that runs
        speed[i] = (offload or {}).get("decode_tok_s") or 0.0
    order = np.lexsort((-np.nan_to_num(speed, nan=-1.0), verdicts))  # by verdict, then by the speed that runs
    rows, data_rows = [], []
    for i in order:
        v = {k: float(a[i, 0, 0, 0]) for k, a in r.items()}
        status = VERDICTS[int(v["verdict"])]
        runs = v["verdict"] <= 1
        offload = offloads.get(i)
        ev = _evidence(table, engine, devs[i], q.id)
        data_rows.append({
            "device": devs[i].id, "name": devs[i].name, "status": status,
            "total_gib": _finite(v["total_bytes"] / GIB, 3), "usable_gib": _finite(v["usable_bytes"] / GIB, 3),
            "decode_tok_s": _finite(v["decode_tok_s"], 2) if runs else None,
            "ttft_s": _finite(v["ttft_s"], 4) if runs else None,
            "max_context": int(v["max_context"]) if v["max_context"] > 0 else None,
            "price_usd": devs[i].price_usd, "cloud_usd_per_hour": _hourly(devs[i], 1),
            "offload": offload, "evidence": ev,
        })
        rows.append([
            devs[i].name, status, f"{_gib(v['total_bytes']):.1f} / {_gib(v['usable_bytes']):.1f}",
            _rounded(v["decode_tok_s"], 1) if runs else (
                f"{_rounded(offload['decode_tok_s'], 1)} (offload)" if offload and offload["decode_tok_s"] else "—"),
            _rounded(v["ttft_s"], 2) if runs else (
                f"{_rounded(offload['ttft_s'], 2)} (offload)" if offload and offload["ttft_s"] else "—"),
            _ctx_label(int(v["max_context"])) if v["max_context"] > 0 else "—",
            f"${devs[i].price_usd:,.0f}" if devs[i].price_usd else "—", _level(ev),
        ])
    rep = Report(
        title=f"Hardware leaderboard — {arch.name}, {q.id}, {context:,} context, {engine}",
        subtitle=f"{len(devs)} devices; decode at batch {batch}, TTFT for a {prompt_tokens:,}-token prompt."
                 + long_context_note(arch),
        data={"model": arch.id, "quant": q.id, "context": context, "engine": engine, "rows": data_rows},
    )
    rep.add("Devices", "table", rows, ["Hardware", "Status", "Total / usable GiB", "Decode tok/s", "TTFT s",
                                       "Max safe ctx", "Price", "Evidence (decode band)"])
    rep.sections[-1].interactive = True
    rep.sections[-1].note = EVIDENCE_NOTE
    add_rig_section(rep, base, devs, verdicts, q, context, batch, table)
    # Context scaling of the six fastest devices that fit.
    top = [i for i in order if r["verdict"][i, 0, 0, 0] <= 1][:6]
    if top:
        ctxs = contexts_for(arch)
        scale = sweep_scenario(base.replace(prompt_tokens=max(ctxs)),  # decode at a full context
                               [devs[i] for i in top], [q], ctxs, [batch], table=table, with_max_context=False)
        rep.charts.append(Chart(f"Decode speed at a full context ({q.id}, batch {batch})", "context (tokens)", "tok/s", {
            devs[i].name: (ctxs, [round(float(x), 2) if v <= 1 else float("nan")
                                  for x, v in zip(scale["decode_tok_s"][k, 0, :, 0], scale["verdict"][k, 0, :, 0])])
            for k, i in enumerate(top)}))
    if len(order) and r["verdict"][order[0], 0, 0, 0] <= 1:
        best = devs[order[0]]
        est = predict(arch, best, q.id, context, engine, prompt_tokens=prompt_tokens, batch=batch, kv_dtype=kv.id,
                      coefficients=table or "default")
        rep.add(f"Launch commands (fastest that fits: {best.name})", "code",
                [[est.launch[k]] for k in ("llama_cpp", "vllm", "ollama") if est.launch.get(k)])
    return rep


def _cheapest_fitting(arch: ModelArch, engine: str, kv_dtype: str, quants: Sequence[QuantFormat], context: int,
                      table: Coefficients | None) -> list[Device | None]:
    """Per format, the single catalogue device (a GPU or a unified-memory machine) with the lowest purchase price on
    which it fits (or is tight) at ``context``; None where no priced device holds it."""
    devs = [d for d in load_devices() if engine in d.engines and d.kind != "cpu" and d.price_usd]
    if not devs:
        return [None] * len(quants)
    r = sweep_scenario(Scenario(arch, engine=engine, kv_dtype=kv_dtype, prompt_tokens=context), devs, list(quants),
                       [context], [1], table=table, with_max_context=False)
    out: list[Device | None] = []
    for j in range(len(quants)):
        fits = [i for i in range(len(devs)) if r["verdict"][i, j, 0, 0] <= 1]
        out.append(min((devs[i] for i in fits), key=lambda d: d.price_usd) if fits else None)
    return out


def _offload_speed(base: Scenario, device: Device, quant: QuantFormat, context: int, batch: int,
                   table: Coefficients | None, values: Mapping[str, float]) -> dict[str, Any] | None:
    """What a configuration that needs offload runs at (as ``predict`` gives it): the most layers that fit on the
    device (``gpu_layers``), the rest and their KV in host RAM, decode and TTFT there."""
    layers = base.model.num_layers if isinstance(base.model, ModelArch) else None
    if not layers or not np.isfinite(values.get("max_gpu_layers", np.nan)):
        return None
    on_gpu = int(min(values["max_gpu_layers"], layers))
    share = offload_that_runs(values["max_gpu_layers"], layers)
    r = sweep_scenario(base.replace(offload_fraction=share), [device], [quant], [context], [batch],
                       table=table, with_max_context=False)
    decode, ttft = float(r["decode_tok_s"][0, 0, 0, 0]), float(r["ttft_s"][0, 0, 0, 0])
    return {"gpu_layers": on_gpu, "layers": layers, "offload_fraction": round(share, 4),
            "decode_tok_s": _finite(decode, 2), "ttft_s": _finite(ttft, 4)}


def matrix_report(arch: ModelArch, device: Device, engine: str = "llama.cpp", *, contexts: Sequence[int] | None = None,
                  table: Coefficients | None = None, device_count: int = 1, kv_dtype: str | None = None) -> Report:
    """Quantization x context: total memory, status and decode for each cell."""
    names = MATRIX_QUANTS if traits(engine).gguf else VLLM_MATRIX_QUANTS
    quants: list[QuantFormat] = [qf for qf in quant_formats()
                                 if qf.id in names and engine in qf.engines and qf.bits_per_weight]
    known = {qf.id: known_weights_bytes(arch, qf, engine) for qf in quants}
    quants.sort(key=lambda qf: -(known[qf.id][0] or mem.weights_bytes(arch, *format_bits(arch, qf, engine))))  # widest first
    ctxs = list(contexts or contexts_for(arch))
    kv = resolve_kv_dtype(kv_dtype or traits(engine).default_kv_dtype, engine)
    # decode in each cell at its own full context (the KV read grows with it), not at one fixed prompt
    r = sweep_scenario(Scenario(arch, engine=engine, kv_dtype=kv.id, device_count=device_count,
                                prompt_tokens=max(ctxs)), [device], quants, ctxs, [1], table=table)
    cheapest = _cheapest_fitting(arch, engine, kv.id, quants, max(ctxs), table)
    rows, data_rows = [], []
    for j, qf in enumerate(quants):
        weights = float(r["weights_total_bytes"][0, j, 0, 0])
        bits = weights_bits_per_weight(arch, qf, weights, known[qf.id][1])
        increase = qf.perplexity_increase_pct
        tier = quality_tier(increase)
        row = [qf.id, bits, _gib(weights), f"{tier} (+{increase:.1f}% PPL)" if tier else "not measured"]
        cells = []
        for k in range(len(ctxs)):
            v = {name: float(a[0, j, k, 0]) for name, a in r.items()}
            speed = f", {v['decode_tok_s']:.1f} tok/s" if v["verdict"] <= 1 else ""
            row.append(f"{_gib(v['total_bytes']):.1f} GiB {VERDICTS[int(v['verdict'])]}{speed}")
            cells.append({"context": int(ctxs[k]), "total_gib": _finite(v["total_bytes"] / GIB, 3),
                          "kv_cache_gib": _finite(v["kv_cache_bytes"] / GIB, 3), "verdict": VERDICTS[int(v["verdict"])],
                          "decode_tok_s": _finite(v["decode_tok_s"], 2) if v["verdict"] <= 1 else None})
        pick = cheapest[j]
        row.append(f"{pick.name} (${pick.price_usd:,.0f})" if pick else "none priced fits")
        ev = _evidence(table, engine, device, qf.id)
        row.append(_level(ev))
        rows.append(row)
        data_rows.append({"quant": qf.id, "bits_per_weight": bits, "weights_gib": _finite(weights / GIB, 3),
                          "evidence": ev,
                          "cheapest_device": None if pick is None else {"device": pick.id, "name": pick.name,
                                                                     "price_usd": pick.price_usd,
                                                                     "context": int(max(ctxs))},
                          "quality": None if tier is None else {
                              "tier": tier, "perplexity_increase_pct": increase,
                              "measured_on": qf.quality["measured_on"], "source": qf.quality["source"]},
                          "cells": cells})
    usable = _gib(r["usable_bytes"][0, 0, 0, 0])
    rep = Report(
        title=f"Quantization x context — {arch.name} on {device.name} ({engine})",
        subtitle=f"Usable device memory {usable:.2f} GiB; KV cache {kv.id}; batch 1; decode at a full context."
                 + long_context_note(arch),
        data={"model": arch.id, "gpu": device.id, "engine": engine, "usable_gib": usable,
              "contexts": ctxs, "rows": data_rows},
    )
    rep.add("Matrix", "table", rows, ["Quant", "Bits/weight", "Weights GiB", "Quality",
                                      *[_ctx_label(c) for c in ctxs], f"Cheapest device at {_ctx_label(max(ctxs))}",
                                      "Evidence (decode band)"])
    measured = next((qf.quality for qf in quants if qf.quality), None)
    if measured:
        rep.sections[-1].note = (
            f"Quality: perplexity against F16 measured on {measured['measured_on']} (each format's figure has its "
            "source in predictor/data/quants.json); tiers: under 0.5% near-lossless, under 2% good, under 5% fair, "
            "else poor. A larger model loses less to the same format; a format not measured there says so.")
    # Launch commands for the widest format that fits at the first context.
    fitting = [j for j in range(len(quants)) if r["verdict"][0, j, 0, 0] <= 1]
    if fitting:
        qf = quants[fitting[0]]
        est = predict(arch, device, qf.id, ctxs[0], engine, device_count=device_count, kv_dtype=kv.id,
                      coefficients=table or "default")
        rep.add(f"Launch commands ({qf.id}, {ctxs[0]:,} context: the widest format that fits)", "code",
                [[est.launch[k]] for k in ("llama_cpp", "vllm", "ollama") if est.launch.get(k)])
    rep.charts.append(Chart("Required memory by quantization", "context (tokens)", "GiB", {
        qf.id: (ctxs, [_gib(x) for x in r["total_bytes"][0, j, :, 0]]) for j, qf in enumerate(quants)
    }, hline=usable, hline_label="usable"))
    return rep


def catalogue_models_report(models: Sequence[ModelArch]) -> Report:
    from benchcal.reports.device_models import MODEL_FIELDS, model_fields

    data = [model_fields(m) for m in models]
    rows = [[d[k] for k in MODEL_FIELDS] for d in data]
    rep = Report(title=f"Models ({len(rows)})", data=data)
    for row in rows:  # the context with thousands separators in table, md and html only
        row[-1] = f"{row[-1]:,}"
    rep.add("Catalogue", "table", rows, ["Id", "Name", "Params B", "Active B", "Arch", "Attention", "Layers", "Max ctx"])
    return rep


def catalogue_devices_report(devices: Sequence[Device]) -> Report:
    rows = [[d.id, d.name, d.kind, round(d.memory_gib, 1), d.memory_type, d.bandwidth_gbs, d.fp16_tflops,
             d.architecture, f"${d.price_usd:,.0f}" if d.price_usd else "—",
             f"${d.cloud_usd_per_hour}/h" if d.cloud_usd_per_hour else "—"] for d in devices]
    rep = Report(title=f"Devices ({len(rows)})", data=[
        {"id": d.id, "name": d.name, "kind": d.kind, "memory_gib": round(d.memory_gib, 3), "memory_type": d.memory_type,
         "bandwidth_gbs": d.bandwidth_gbs, "fp16_tflops": d.fp16_tflops, "architecture": d.architecture,
         "price_usd": d.price_usd, "cloud_usd_per_hour": d.cloud_usd_per_hour} for d in devices])
    rep.add("Catalogue", "table", rows, ["Id", "Name", "Kind", "GiB", "Memory", "GB/s", "FP16 TFLOPS", "Arch",
                                         "Price", "Cloud"])
    return rep


def _rental(device: Device, count: int) -> tuple[float, CloudOffer]:
    """The cheapest dated on-demand offer of ``count`` of ``device`` (:func:`predictor.prices.cheapest_rental`); only asked
    for devices with an offer."""
    rental = cheapest_rental(device, count)
    assert rental is not None, device.id
    return rental


def _hourly(device: Device, count: int) -> float | None:
    """$ per hour of ``count`` of ``device`` at its cheapest dated on-demand offer (what predict's and cost's prices are), or
    None where nobody offers it."""
    rental = cheapest_rental(device, count)
    return round(rental[0], 4) if rental else None


def recommend_report(arch: ModelArch, context: int, quant: str | None = None, engine: str = "llama.cpp", *,
                     min_decode: float = 0.0, budget_usd: float | None = None, table: Coefficients | None = None,
                     prompt_tokens: int = 4096, rig_sizes: Sequence[int] = (1, 2, 4, 8),
                     max_ttft_ms: float | None = None, max_tpot_ms: float | None = None,
                     output_tokens: int = 256, evidence: str = "any") -> Report:
    """The cheapest single GPU, unified-memory machine and multi-GPU rig that fit (priced devices only), the most
    tokens/s per dollar, the fastest that fits and the cheapest cloud rental (:data:`PICKS`).

    ``evidence``: only devices whose prediction has that evidence or better (:func:`predictor.evidence.admits`:
    measured, family, prior, any); every pick names its evidence and the band at that level.

    A candidate must fit ("fits" verdict), decode at least ``min_decode`` tok/s and cost at most
    ``budget_usd`` (purchase price x count; devices without a price are left out when a budget is set).
    With ``max_ttft_ms`` and/or ``max_tpot_ms``, also each single device's serving capacity at that latency target
    (:func:`add_serving_target_section`).
    """
    q = resolve_quant(quant or default_format(arch, engine), engine)
    devs = [d for d in load_devices() if engine in d.engines and d.kind != "cpu"]
    require_bits(q, known_weights_bytes(arch, q, engine)[0])
    candidates = []  # (device, count, values)
    evidence_of: dict[str, dict[str, Any]] = {}  # per device: its rows' evidence (predictor.evidence)
    for n in rig_sizes:
        pool = devs if n == 1 else [d for d in devs if d.kind == "gpu"]
        if traits(engine).tensor_parallel and tensor_parallel_refusal(arch, n):
            continue  # vLLM refuses this tensor-parallel size for the model
        if not pool:
            continue
        r = sweep_scenario(Scenario(arch, engine=engine, device_count=n, prompt_tokens=prompt_tokens),
                           pool, [q], [context], [1], table=table, with_max_context=False)
        for i, d in enumerate(pool):
            v = {k: float(a[i, 0, 0, 0]) for k, a in r.items()}
            known = bool(np.isfinite(v["decode_tok_s"]))  # no bandwidth in the catalogue: decode unknown
            if v["verdict"] != 0 or (min_decode > 0 and not known) or (known and v["decode_tok_s"] < min_decode):
                continue
            price = d.price_usd * n if d.price_usd else None
            if budget_usd is not None and (price is None or price > budget_usd):
                continue
            v["evidence"] = evidence_of.setdefault(d.id, _evidence(table, engine, d, q.id))
            if not admits(v["evidence"]["level"], evidence):
                continue
            candidates.append((d, n, v, price))

    def cheapest(pool):  # a price-based pick: only devices with a purchase price
        priced = [c for c in pool if c[3]]
        return min(priced, key=lambda c: (c[3], -c[2]["decode_tok_s"])) if priced else None

    picks = [(PICKS[key], key, pick) for key, pick in (
        ("cheapest_gpu", cheapest([c for c in candidates if c[1] == 1 and c[0].kind == "gpu"])),
        ("best_value", max((c for c in candidates if c[3] and np.isfinite(c[2]["decode_tok_s"])),
                           key=lambda c: c[2]["decode_tok_s"] / c[3], default=None)),
        ("cheapest_unified", cheapest([c for c in candidates if c[0].kind == "unified"])),
        ("cheapest_multi_gpu", cheapest([c for c in candidates if c[1] > 1])),
        ("fastest", max((c for c in candidates if np.isfinite(c[2]["decode_tok_s"])),
                        key=lambda c: c[2]["decode_tok_s"], default=None)),
        ("cheapest_cloud", min((c for c in candidates if c[0].kind != "cpu" and cloud_offers(c[0])), default=None,
                               key=lambda c: _rental(c[0], c[1])[0])),
    )]
    rows, commands, data = [], [], []
    for label, key, pick in picks:
        if pick is None:
            rows.append([label, "none priced fits" if key.startswith("cheapest") or key == "best_value" else
                         "none fits", "—", "—", "—", "—", "—"])
            continue
        d, n, v, price = pick
        name = f"{n}x {d.name}" if n > 1 else d.name
        cost = f"${price:,.0f}" if price else "—"
        rental = None
        if key == "cheapest_cloud":
            hourly, offer = _rental(d, n)
            rental = {"usd_per_hour": round(hourly, 4), "provider": offer.provider, "product": offer.product,
                      "gpus_rented": max(n, offer.min_gpus), "checked_at": offer.checked_at, "source": offer.source}
            cost = f"${hourly:.2f}/h ({offer.provider}, {offer.product})"
        rows.append([label, name, f"{_gib(v['total_bytes']):.1f} / {_gib(v['usable_bytes']):.1f}",
                     round(v["decode_tok_s"], 1), _rounded(v["ttft_s"], 2), cost, _level(v["evidence"])])
        est = predict(arch, d, q.id, context, engine, device_count=n, prompt_tokens=prompt_tokens,
                      coefficients=table or "default")
        commands.append([f"# {label}: {name}"])
        commands += [[est.launch[k]] for k in ("llama_cpp", "vllm", "ollama") if est.launch.get(k)]
        data.append({"pick": key, "label": label, "device": d.id, "count": n, "total_gib": _gib(v["total_bytes"]),
                     "decode_tok_s": round(v["decode_tok_s"], 2), "ttft_s": round(v["ttft_s"], 3) if np.isfinite(v["ttft_s"]) else None,
                     "price_usd": price, "evidence": v["evidence"], "launch": est.launch,
                     **({"rental": rental} if rental else {})})
    constraints = [f"min decode {min_decode:g} tok/s" if min_decode else "", f"budget ${budget_usd:,.0f}" if budget_usd else "",
                   f"evidence {evidence} or better" if evidence != "any" else ""]
    rep = Report(
        title=f"Recommended hardware — {arch.name}, {q.id}, {context:,} context, {engine}",
        subtitle=f"{len(candidates)} configurations fit" + "".join(f"; {c}" for c in constraints if c) + "."
                 + long_context_note(arch),
        data={"model": arch.id, "quant": q.id, "context": context, "engine": engine, "picks": data},
    )
    rep.add("Recommendations", "table", rows, ["Pick", "Hardware", "Total / usable GiB", "Decode tok/s", "TTFT s", "Price",
                                               "Evidence (decode band)"], note=EVIDENCE_NOTE)
    ctxs = contexts_for(arch)
    series = {}
    same: dict[tuple[str, int], list[str]] = {}  # one line per configuration, named by every pick it is
    for label, _key, pick in picks:
        if pick is not None:
            same.setdefault((pick[0].id, pick[1]), []).append(label)
    for label, _key, pick in picks:
        if pick is None or same[(pick[0].id, pick[1])][0] != label:
            continue
        d, n = pick[0], pick[1]
        s_ = sweep_scenario(Scenario(arch, engine=engine, device_count=n, prompt_tokens=max(ctxs)),
                            [d], [q], ctxs, [1], table=table, with_max_context=False)  # decode at a full context
        name = f"{n}x {d.name}" if n > 1 else d.name
        series[f"{', '.join(same[(d.id, n)])}: {name}"] = (
            ctxs, [round(float(x), 2) if v <= 1 else float("nan")
                   for x, v in zip(s_["decode_tok_s"][0, 0, :, 0], s_["verdict"][0, 0, :, 0])])
    if series:
        rep.charts.append(Chart(f"Decode speed at a full context ({q.id})", "context (tokens)", "tok/s", series))
    rep.add("Launch commands", "code", commands)
    if max_ttft_ms is not None or max_tpot_ms is not None:
        singles = [c[0] for c in candidates if c[1] == 1]
        add_serving_target_section(rep, arch, q.id, context, engine, singles, table=table,
                                   prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                   max_ttft_ms=max_ttft_ms, max_tpot_ms=max_tpot_ms)
    return rep


SERVING_TARGET_ROWS = 15  # devices listed in the serving-target section (all of them in the JSON)


def add_serving_target_section(rep: Report, arch: ModelArch, quant: str, context: int, engine: str,
                               devices: Sequence[Device], *, table: Coefficients | None,
                               prompt_tokens: int, output_tokens: int, max_ttft_ms: float | None,
                               max_tpot_ms: float | None) -> None:
    """For each device, the most requests in flight that keep TTFT and TPOT within the target
    (:func:`predictor.load.max_concurrency`: a closed loop of equal requests, so its TTFT is every request's, p50 and
    p99 alike), its output tokens/s there, and the cost per 1M output tokens at that load where the catalogue has a
    cloud price (price per hour / tokens per hour)."""
    target = " and ".join(t for t in (f"TTFT <= {max_ttft_ms:g} ms" if max_ttft_ms is not None else "",
                                      f"TPOT <= {max_tpot_ms:g} ms" if max_tpot_ms is not None else "") if t)
    found = []
    for d in devices:
        scenario = Scenario(arch, device=d, engine=engine, quant=quant, context=context, prompt_tokens=prompt_tokens)
        overheads = table.serving_fit(engine, d.id) if table is not None else None
        best = max_concurrency(scenario, output_tokens, max_ttft_ms=max_ttft_ms, max_tpot_ms=max_tpot_ms,
                               coefficients=table or "default", overheads=overheads)
        if best is None:
            continue
        hourly = _hourly(d, 1)
        per_million = hourly / (best["output_tok_s"] * 3600.0) * 1e6 if hourly and best["output_tok_s"] > 0 else None
        found.append({"device": d.id, "name": d.name, **best, "cloud_usd_per_hour": hourly,
                      "usd_per_1m_output_tokens": round(per_million, 4) if per_million is not None else None})
    found.sort(key=lambda r: (-r["output_tok_s"], r["device"]))
    rows = [[r["name"], r["concurrency"], f"{r['output_tok_s']:.0f}", f"{r['ttft_ms']:.0f}", f"{r['tpot_ms']:.1f}",
             f"${r['cloud_usd_per_hour']:.2f}" if r["cloud_usd_per_hour"] else "—",
             f"${r['usd_per_1m_output_tokens']:.3f}" if r["usd_per_1m_output_tokens"] is not None else "—",
             r["limited_by"]] for r in found[:SERVING_TARGET_ROWS]]
    if not rows:
        rows = [["none meets the target with one request in flight", "—", "—", "—", "—", "—", "—", "—"]]
    calibrated = sum(not r["overheads"]["source"].startswith("uncalibrated") for r in found)
    rep.add(f"Serving at {target} ({prompt_tokens:,}-token prompts, {output_tokens:,} tokens out; "
            f"{len(found)} of {len(devices)} devices meet it; server terms fitted for {calibrated})", "table", rows,
            ["Device", "Requests in flight", "Output tok/s", "TTFT ms", "TPOT ms", "Cloud $/h", "$ / 1M output tokens",
             "Limited by"])
    if isinstance(rep.data, dict):
        rep.data["serving_target"] = {"max_ttft_ms": max_ttft_ms, "max_tpot_ms": max_tpot_ms,
                                      "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                                      "devices": found}


def _finite(x: float, nd: int) -> float | None:
    """A figure for the JSON: rounded, or null where the catalogue cannot give it (NaN)."""
    return round(float(x), nd) if np.isfinite(x) else None


def add_load_section(rep: Report, load: dict) -> None:
    """The serving-under-load figures (:func:`predictor.load.predict_load`) as a section and as ``load`` in the
    report's data."""
    mode = {"serial": "one request at a time", "continuous": "continuous batching"}[load["mode"]]
    rep.add(f"Serving under load: {load['concurrency']} requests in flight ({mode})", "kv", [
        ["Requests / s", f"{load['request_throughput']:.3g}"],
        ["Output tokens / s", f"{load['output_tok_s']:.1f}"],
        ["TTFT", f"{load['ttft_ms']:.1f} ms"],
        ["TPOT", f"{load['tpot_ms']:.2f} ms"],
        ["End-to-end", f"{load['e2el_ms']:.0f} ms"],
        ["Requests", f"{load['prompt_tokens']:,}-token prompts, {load['output_tokens']:,} tokens out"],
        ["Server terms", load["overheads"]["source"]],
    ])
    if isinstance(rep.data, dict):
        rep.data["load"] = load


def add_rate_section(rep: Report, load: dict) -> None:
    """The Poisson-arrival figures (:func:`predictor.load.predict_rate`) as a section and as ``load`` in the report's
    data."""
    mode = {"serial": "one request at a time", "continuous": "continuous batching"}[load["mode"]]
    rows = [["Capacity", f"{load['capacity_requests_per_s']:.3g} requests / s (utilization {load['utilization']:.0%})"]]
    if load["saturated"]:
        rows.append(["Latency", "unbounded: the arrival rate is at or above the capacity, so the queue grows "
                                "without end"])
    else:
        rows += [["Requests / s", f"{load['request_throughput']:.3g}"],
                 ["Output tokens / s", f"{load['output_tok_s']:.1f}"]]
        for label, key, nd in (("TTFT", "ttft_ms", 1), ("TPOT", "tpot_ms", 2), ("End-to-end", "e2el_ms", 0)):
            d = load[key]
            rows.append([f"{label} mean / p50 / p90 / p99",
                         " / ".join(f"{d[k]:.{nd}f}" for k in ("mean", "p50", "p90", "p99")) + " ms"])
    rows += [["Requests", f"{load['prompt_tokens']:,}-token prompts, {load['output_tokens']:,} tokens out; "
                          f"{load['requests_simulated']:,} Poisson arrivals simulated (seed {load['seed']}), the first "
                          f"{load['warmup']} left out"],
             ["Server terms", load["overheads"]["source"]]]
    rep.add(f"Serving under load: {load['request_rate']:g} requests / s ({mode})", "kv", rows)
    if isinstance(rep.data, dict):
        rep.data["load"] = load


def load_curve_charts(points: Sequence[dict]) -> list[Chart]:
    """Throughput and latency against the requests in flight, from :func:`predictor.load.predict_load` at several
    concurrencies (``points``)."""
    xs = [p["concurrency"] for p in points]
    return [
        Chart("Serving: output tokens/s vs requests in flight (predicted)", "requests in flight", "output tok/s",
              {"predicted": (xs, [p["output_tok_s"] for p in points])}),
        Chart("Serving: latency vs requests in flight (predicted)", "requests in flight", "ms",
              {"TTFT": (xs, [p["ttft_ms"] for p in points]), "TPOT": (xs, [p["tpot_ms"] for p in points])}),
    ]


def rate_curve_charts(points: Sequence[dict]) -> list[Chart]:
    """TTFT percentiles and output tokens/s against the request rate, from :func:`predictor.load.predict_rate` below
    the capacity (``points``; saturated ones are left out)."""
    ok = [p for p in points if not p["saturated"]]
    xs = [p["request_rate"] for p in ok]
    return [
        Chart("Serving: TTFT vs request rate (predicted, Poisson arrivals)", "requests / s", "TTFT ms",
              {f"p{q}": (xs, [p["ttft_ms"][f"p{q}"] for p in ok]) for q in (50, 90, 99)}),
        Chart("Serving: output tokens/s vs request rate (predicted)", "requests / s", "output tok/s",
              {"predicted": (xs, [p["output_tok_s"] for p in ok])}),
    ] if ok else []
