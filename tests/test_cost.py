"""Prices and cost (predictor/prices.py, predictor/data/prices.json, `benchcal cost`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from predictor.devices import resolve_device
from predictor.prices import (
    DAYS_PER_MONTH,
    break_even_months,
    cloud_offers,
    load_prices,
    monthly_usd,
    power_monthly_usd,
    serverless_prices,
    serverless_usd,
    usd_per_1m_tokens,
)

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchcal", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_the_price_table_is_dated_sourced_and_names_catalogue_entries():
    cloud, serverless = load_prices()  # raises on an unknown device or model, a bad date or a non-positive price
    assert len(cloud) >= 200 and len(serverless) >= 140
    assert all(o.source and o.checked_at for o in cloud)
    # every serverless price read from a commit-pinned file: the provider's own docs, or a transcription of its page
    assert all((p.transcribed_from or p.source).startswith("https://github.com/") and p.checked_at for p in serverless)
    assert all("/blob/" in o.transcribed_from for o in cloud if o.transcribed_from)


def test_offers_merge_the_table_with_the_catalogue_headline_once():
    h100 = resolve_device("h100-sxm")
    offers = cloud_offers(h100)
    assert [o.usd_per_gpu_hour for o in offers] == sorted(o.usd_per_gpu_hour for o in offers)
    # the headline (Lambda, $4.29, lambda.ai/pricing) is the table's own row: listed once
    assert sum(1 for o in offers if o.usd_per_gpu_hour == h100.cloud_usd_per_hour) == 1
    v100 = cloud_offers(resolve_device("v100-sxm2-32gb"))  # not in the table: the headline alone
    assert len(v100) == 1 and v100[0].headline and v100[0].min_gpus == 8  # Lambda rents its V100s as 8x only
    t4 = cloud_offers(resolve_device("t4"))  # the table's marketplace offer and the catalogue's AWS headline
    assert sum(o.headline for o in t4) == 1 and any(o.provider == "AWS EC2" and o.checked_at == "2026-01-21" for o in t4)


def test_cost_arithmetic():
    assert monthly_usd(2.0, 8) == pytest.approx(2.0 * 8 * 365.25 / 12)
    assert power_monthly_usd(450, 8, 0.15) == pytest.approx(0.45 * 8 * DAYS_PER_MONTH * 0.15)
    assert break_even_months(2000.0, 150.0, 50.0) == pytest.approx(20.0)
    assert break_even_months(2000.0, 40.0, 50.0) is None
    assert usd_per_1m_tokens(3.6, 100.0) == pytest.approx(10.0)  # $3.6/h at 100 tok/s: 360,000 tokens an hour
    assert usd_per_1m_tokens(3.6, 0.0) is None
    (gmi,) = [p for p in serverless_prices("llama-3.3-70b") if p.provider == "GMI Cloud"]
    assert serverless_usd(gmi, 2e6, 1e6) == pytest.approx(2 * 0.25 + 0.75)
    prices = serverless_prices("llama-3.3-70b")
    assert [p.usd_per_1m_output for p in prices] == sorted(p.usd_per_1m_output for p in prices)  # cheapest first


def test_cost_command_json_is_numbers_traceable_to_the_offers():
    p = run("cost", "--model", "llama-3.3-70b", "--gpu", "rtx-pro-6000", "--concurrency", "4", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    dev = d["device"]
    assert dev["verdict"] in ("fits", "tight") and dev["decode_tok_s"] > 0
    assert dev["usd_per_1m_output_batch1"] == pytest.approx(
        dev["cheapest_usd_per_gpu_hour"] / (dev["decode_tok_s"] * 3600) * 1e6, rel=1e-3)
    rvb = d["rent_vs_buy"]
    assert rvb["break_even_months"] == pytest.approx(
        rvb["purchase_usd"] / (rvb["rent_monthly_usd"] - rvb["power_monthly_usd"]), rel=1e-2)
    assert d["cloud"] and all(isinstance(e["usd_per_gpu_hour"], float) and e["checked_at"] for e in d["cloud"])
    assert all(e["usd_per_1m_output_at_load"] is not None for e in d["cloud"])
    outputs = [e["usd_per_1m_output"] for e in d["serverless"]]
    assert outputs == sorted(outputs) and "GMI Cloud" in {e["provider"] for e in d["serverless"]}


def test_cost_says_what_it_cannot_price():
    p = run("cost", "--model", "qwen2.5-14b", "--gpu", "l20")
    assert p.returncode == 0, p.stderr
    assert "L20 48GB has no rental price in the catalogue or the price table" in p.stdout
    assert "no serverless price for Qwen2.5 14B" in p.stdout
    for fmt in ("md", "html"):
        out = run("cost", "--model", "llama-3.1-8b", "--format", fmt)
        assert out.returncode == 0 and "Cloud comparison" in out.stdout and "NaN" not in out.stdout, fmt


@pytest.mark.parametrize("args, message", [
    (["--hours-per-day", "25"], "at most 24"),
    (["--gpu", "cpu"], "per rented or bought GPU"),
    (["--prompt", "9000"], "does not fit the context"),
    (["--usd-per-kwh", "-1"], "--usd-per-kwh"),
])
def test_bad_cost_input_is_one_line_and_exit_2(args, message):
    p = run("cost", "--model", "llama-3.1-8b", *args)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and message in p.stderr
    assert "Traceback" not in p.stderr


def test_recommend_cloud_pick_is_the_cheapest_dated_offer_of_what_holds_the_model():
    d = json.loads(run("recommend", "--model", "qwen2.5-72b", "--ctx", "8192", "--format", "json").stdout)
    (cloud,) = [p for p in d["picks"] if p["pick"] == "cheapest_cloud"]
    rental = cloud["rental"]
    offers = [o for o in cloud_offers(resolve_device(cloud["device"])) if o.billing == "on-demand"]
    assert rental["usd_per_hour"] == pytest.approx(
        min(o.usd_per_gpu_hour * max(cloud["count"], o.min_gpus) for o in offers))
    assert rental["provider"] and rental["source"] and rental["gpus_rented"] >= cloud["count"]


@pytest.mark.parametrize(("gpu", "gpus"), [("rtx-4090", "1"), ("h100-sxm", "1"), ("a100-sxm-80gb", "2")])
def test_predict_prices_its_tokens_at_the_cheapest_on_demand_offer_as_cost_does(gpu, gpus):
    # one answer to "what does 1M output tokens cost here": predict's is at the offer benchcal cost lists first
    d = json.loads(run("predict", "--model", "llama-3.1-8b", "--gpu", gpu, "--gpus", gpus, "--format", "json").stdout)
    offers = [o for o in cloud_offers(resolve_device(gpu)) if o.billing == "on-demand"]  # not spot or reserved
    count = int(gpus)
    cheapest = min(offers, key=lambda o: o.usd_per_gpu_hour * max(count, o.min_gpus))
    assert d["gpu"]["cloud_usd_per_hour"] == cheapest.usd_per_gpu_hour
    assert d["gpu"]["cloud_offer"]["provider"] == cheapest.provider and d["gpu"]["cloud_offer"]["source"]
    hourly = cheapest.usd_per_gpu_hour * max(count, cheapest.min_gpus)
    tok_s = d["throughput"]["decode_tok_s_total"]
    assert d["throughput"]["cost_per_1m_output_usd"] == pytest.approx(hourly / (tok_s * 3600) * 1e6, rel=0.01)


def test_predict_on_a_device_nobody_rents_gives_no_price():
    d = json.loads(run("predict", "--model", "llama-3.1-8b", "--gpu", "ascend-910b", "--format", "json").stdout)
    assert d["gpu"]["cloud_offer"] is None and d["throughput"]["cost_per_1m_output_usd"] is None
