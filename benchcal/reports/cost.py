"""The cost report: cost per 1M output tokens at batch 1 and at a serving load, the cloud comparison (every dated
offer of every device that holds the model), rent vs buy with power, and serverless API prices
(:mod:`predictor.prices` for the prices and the arithmetic, :mod:`predictor.grid` / :mod:`predictor.load` for the
speeds)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from benchcal.reports.render import Report
from predictor.architecture import ModelArch
from predictor.coefficients import Coefficients
from predictor.devices import Device, load_devices
from predictor.estimate import predict
from predictor.grid import sweep_scenario
from predictor.load import predict_load
from predictor.prices import (
    DAYS_PER_MONTH,
    break_even_months,
    cheapest_rental,
    cloud_offers,
    monthly_usd,
    power_monthly_usd,
    serverless_prices,
    serverless_usd,
    usd_per_1m_tokens,
)
from predictor.quants import resolve_quant
from predictor.result import VERDICTS
from predictor.scenario import Scenario


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def _money(x: float | None) -> str:
    return "—" if x is None else (f"${x:,.2f}" if x < 1000 else f"${x:,.0f}")


def cost_report(arch: ModelArch, quant: str, context: int, engine: str, *, table: Coefficients | None = None,
                device: Device | None = None, concurrency: int | None = None, output_tokens: int = 256,
                prompt_tokens: int = 4096, hours_per_day: float = 8.0, usd_per_kwh: float = 0.15,
                input_tokens_per_output: float = 1.0, devices: Sequence[Device] | None = None) -> Report:
    q = resolve_quant(quant, engine)
    base = Scenario(arch, engine=engine, quant=q.id, context=context, prompt_tokens=prompt_tokens)
    candidates = [d for d in (devices or load_devices()) if engine in d.engines and d.kind != "cpu" and cloud_offers(d)]
    r = sweep_scenario(base, candidates, [q], [context], [1], table=table, with_max_context=False)
    rep = Report(title=f"Cost — {arch.name}, {q.id}, {context:,} context, {engine}",
                 subtitle=f"{hours_per_day:g} hours a day ({hours_per_day * DAYS_PER_MONTH:,.0f} h a month), "
                          f"power at ${usd_per_kwh:g}/kWh" + (f", {concurrency} requests in flight" if concurrency else ""))
    data: dict = {"model": arch.id, "quant": q.id, "context": context, "engine": engine, "hours_per_day": hours_per_day,
                  "usd_per_kwh": usd_per_kwh, "concurrency": concurrency, "output_tokens": output_tokens,
                  "device": None, "cloud": [], "rent_vs_buy": None, "serverless": []}

    def load_tok_s(dev: Device) -> float | None:
        if not concurrency:
            return None
        scenario = base.replace(device=dev)
        return predict_load(scenario, concurrency, output_tokens, coefficients=table or "default")["output_tok_s"]

    # The device asked for: its speeds and what an hour of it yields.
    chosen = None
    if device is not None:
        est = predict(arch, device, q.id, context, engine, prompt_tokens=prompt_tokens, coefficients=table or "default",
                      launch=False)
        decode = est.values["decode_tok_s"] if est.verdict in ("fits", "tight") else float("nan")
        at_load = load_tok_s(device) if est.verdict in ("fits", "tight") else None
        rental = cheapest_rental(device)
        cheapest = rental[1] if rental else None
        chosen = {"device": device.id, "name": device.name, "verdict": est.verdict, "decode_tok_s": _r(decode),
                  "output_tok_s_at_load": _r(at_load), "cheapest_usd_per_gpu_hour": cheapest.usd_per_gpu_hour
                  if cheapest else None,
                  "usd_per_1m_output_batch1": _r(usd_per_1m_tokens(cheapest.usd_per_gpu_hour, decode), 3)
                  if cheapest else None,
                  "usd_per_1m_output_at_load": _r(usd_per_1m_tokens(cheapest.usd_per_gpu_hour, at_load or 0), 3)
                  if cheapest and at_load else None}
        data["device"] = chosen
        rows = [["Verdict", est.verdict],
                ["Decode at batch 1", f"{decode:.1f} tok/s" if math.isfinite(decode) else "— (does not run)"]]
        if concurrency:
            rows.append([f"Output at {concurrency} requests in flight",
                         f"{at_load:.1f} tok/s" if at_load else "— (does not run)"])
        rows += [["Cheapest rental", f"${cheapest.usd_per_gpu_hour:g}/GPU-h ({cheapest.provider}, {cheapest.product}, "
                  f"{cheapest.billing})"
                  if cheapest else "— (no price in the table or the catalogue)"],
                 ["Cost per 1M output tokens, batch 1", _money(chosen["usd_per_1m_output_batch1"])]]
        if concurrency:
            rows.append([f"Cost per 1M output tokens, {concurrency} in flight", _money(chosen["usd_per_1m_output_at_load"])])
        rep.add(f"On {device.name}", "kv", rows, ["Quantity", "Value"],
                note="$ per hour / (output tokens per second x 3600) x 10^6, at the cheapest on-demand offer below.")

    # Cloud comparison: every offer of every device that holds the model.
    rows = []
    for i, dev in enumerate(candidates):
        verdict = VERDICTS[int(r["verdict"][i, 0, 0, 0])]
        if verdict not in ("fits", "tight"):
            continue
        decode = float(r["decode_tok_s"][i, 0, 0, 0])
        at_load = load_tok_s(dev)
        for o in cloud_offers(dev):
            entry = {"device": dev.id, "provider": o.provider, "product": o.product, "billing": o.billing,
                     "usd_per_gpu_hour": o.usd_per_gpu_hour, "min_gpus": o.min_gpus, "checked_at": o.checked_at,
                     "source": o.source, "transcribed_from": o.transcribed_from, "catalogue_headline": o.headline,
                     "monthly_usd": _r(monthly_usd(o.usd_per_gpu_hour * o.min_gpus, hours_per_day)),
                     "decode_tok_s": _r(decode), "usd_per_1m_output_batch1": _r(usd_per_1m_tokens(o.usd_per_gpu_hour, decode), 3),
                     "usd_per_1m_output_at_load": _r(usd_per_1m_tokens(o.usd_per_gpu_hour, at_load), 3) if at_load else None}
            data["cloud"].append(entry)
    data["cloud"].sort(key=lambda e: (e["usd_per_1m_output_at_load"] or e["usd_per_1m_output_batch1"] or math.inf))
    for e in data["cloud"]:
        row = [e["device"], e["provider"], e["product"], e["billing"], f"${e['usd_per_gpu_hour']:g}",
               e["min_gpus"], _money(e["monthly_usd"]), _money(e["usd_per_1m_output_batch1"])]
        if concurrency:
            row.append(_money(e["usd_per_1m_output_at_load"]))
        rows.append(row + [e["checked_at"] or "—", e["source"]])
    columns = ["Device", "Provider", "Product", "Billing", "$/GPU-h", "Min GPUs", f"Monthly ({hours_per_day:g} h/day)",
               "$/1M out, batch 1"] + ([f"$/1M out, {concurrency} in flight"] if concurrency else []) + ["Checked", "Source"]
    rep.add("Cloud comparison", "table", rows, columns,
            note="Devices that hold the model; each offer as listed on its date (predictor/data/prices.json, and the "
                 "catalogue's headline price in devices.json). Monthly: $/h x GPUs x hours a day x 30.44. Rates change.")

    # Rent vs buy, on the device asked for.
    if device is not None:
        rental = cheapest_rental(device)
        if not rental or not device.price_usd or not device.tdp_w:
            missing = [name for name, ok in (("rental price", rental), ("purchase price", device.price_usd),
                                             ("board power", device.tdp_w)) if not ok]
            rep.add("Rent vs buy", "kv", [["Not applicable", f"{device.name} has no {', no '.join(missing)} in the "
                                                             "catalogue or the price table"]], ["Quantity", "Value"])
        else:
            offer = rental[1]
            rent = monthly_usd(offer.usd_per_gpu_hour, hours_per_day)
            power = power_monthly_usd(device.tdp_w, hours_per_day, usd_per_kwh)
            months = break_even_months(device.price_usd, rent, power)
            data["rent_vs_buy"] = {"purchase_usd": device.price_usd, "rent_monthly_usd": _r(rent),
                                   "power_monthly_usd": _r(power), "tdp_w": device.tdp_w,
                                   "break_even_months": _r(months, 1)}
            rep.add("Rent vs buy", "kv", [
                ["Purchase", f"{_money(device.price_usd)} ({device.sources.get('price', 'devices.json')})"],
                ["Renting", f"{_money(rent)}/month at ${offer.usd_per_gpu_hour:g}/h ({offer.provider}, {offer.billing})"],
                ["Power if bought", f"{_money(power)}/month ({device.tdp_w:g} W board power)"],
                ["Break-even", f"{months:.1f} months" if months else "never (renting costs no more than the power)"],
            ], ["Quantity", "Value"], note="purchase / (rent per month - power per month); the host, cooling and "
                                           "resale are left out.")

    # Serverless API, for the same output tokens a month as the device yields.
    prices = serverless_prices(arch.id)
    tok_s = (chosen or {}).get("output_tok_s_at_load") or (chosen or {}).get("decode_tok_s")
    monthly_out = tok_s * 3600 * hours_per_day * DAYS_PER_MONTH if tok_s else 1e6 * 100
    rows = []
    for p in prices:
        usd = serverless_usd(p, monthly_out * input_tokens_per_output, monthly_out)
        data["serverless"].append({"provider": p.provider, "provider_model": p.provider_model,
                                   "usd_per_1m_input": p.usd_per_1m_input, "usd_per_1m_output": p.usd_per_1m_output,
                                   "checked_at": p.checked_at, "source": p.source,
                                   "monthly_output_tokens": round(monthly_out), "monthly_usd": _r(usd)})
        rows.append([p.provider, p.provider_model, f"${p.usd_per_1m_input:g}", f"${p.usd_per_1m_output:g}",
                     f"{monthly_out / 1e6:,.1f}M", _money(usd), p.checked_at, p.source])
    basis = (f"the output tokens {device.name} yields in {hours_per_day:g} h a day" if tok_s and device
             else "100M output tokens a month")
    if rows:
        rep.add("Serverless API", "table", rows, ["Provider", "Model", "$/1M in", "$/1M out", "Output / month",
                                                  "Monthly", "Checked", "Source"],
                note=f"Monthly: {basis}, with {input_tokens_per_output:g} input token(s) per output token.")
    else:
        rep.add("Serverless API", "kv", [["Not applicable", f"no serverless price for {arch.name} in "
                                                            "predictor/data/prices.json"]], ["Quantity", "Value"])
    data["serverless_basis"] = basis
    rep.data = data
    return rep
