"""Dated prices (``predictor/data/prices.json``) and the arithmetic of cost: rental per month, power, rent-vs-buy
break-even, cost per 1M tokens, serverless API cost.

- **Cloud offers** of a device: every entry of the price table (provider, product, billing mode, $ per GPU-hour,
  the date it was checked, its source) and the catalogue's headline price (``devices.json``: ``cloud_usd_per_hour``
  with its source and note) where the table does not already hold it.
- **Serverless API prices** of a model: $ per 1M input and output tokens, dated, with the provider's page.

The arithmetic: a month is 365.25 / 12 = 30.44 days; power is the board power (``tdp_w``) for the hours run; the
break-even of buying is the purchase price over what renting costs each month less what power costs; cost per 1M
output tokens is $ per hour / (output tokens per second x 3600) x 10^6.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from predictor.errors import BenchcalError

PRICES_PATH = Path(__file__).parent / "data" / "prices.json"
DAYS_PER_MONTH = 365.25 / 12
BILLING = ("on-demand", "spot", "reserved")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# providers a catalogue headline price note starts with (devices.json ``notes.cloud_price``)
PROVIDERS = ("RunPod", "Lambda", "AWS EC2", "AWS", "DigitalOcean", "Vast.ai", "Nebius", "Google Cloud", "Azure",
             "CoreWeave", "Vultr")


@dataclass(frozen=True)
class CloudOffer:
    device: str
    provider: str
    product: str
    billing: str
    usd_per_gpu_hour: float
    min_gpus: int
    checked_at: str | None
    source: str
    transcribed_from: str | None = None
    note: str | None = None
    headline: bool = False  # the catalogue's own price of the device (devices.json)


@dataclass(frozen=True)
class ServerlessPrice:
    model: str
    provider: str
    provider_model: str
    usd_per_1m_input: float
    usd_per_1m_output: float
    checked_at: str
    source: str
    note: str | None = None
    transcribed_from: str | None = None


def _problem(where: str, message: str) -> BenchcalError:
    return BenchcalError(f"{PRICES_PATH.name}: {where}: {message}")


def _positive(entry: dict, key: str, where: str) -> float:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _problem(where, f"{key} must be a positive number, got {value!r}")
    return float(value)


def _text(entry: dict, key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _problem(where, f"{key} must be a non-empty string")
    return value


def _checked(entry: dict, where: str) -> str:
    date = _text(entry, "checked_at", where)
    if not _DATE.match(date):
        raise _problem(where, f"checked_at must be YYYY-MM-DD, got {date!r}")
    return date


def _url(entry: dict, key: str, where: str) -> str:
    url = _text(entry, key, where)
    if not url.startswith("https://"):
        raise _problem(where, f"{key} must be an https URL, got {url!r}")
    return url


@lru_cache(maxsize=1)
def load_prices() -> tuple[tuple[CloudOffer, ...], tuple[ServerlessPrice, ...]]:
    """The price table, checked: every device and model in the catalogues, positive prices, dates, https sources."""
    from predictor.devices import load_devices
    from predictor.models import model_ids

    data = json.loads(PRICES_PATH.read_text())
    devices = {d.id for d in load_devices()}
    models = set(model_ids())
    cloud = []
    for i, e in enumerate(data.get("cloud", [])):
        where = f"cloud[{i}]"
        if e.get("device") not in devices:
            raise _problem(where, f"device {e.get('device')!r} is not in the device catalogue")
        if e.get("billing") not in BILLING:
            raise _problem(where, f"billing must be one of {', '.join(BILLING)}, got {e.get('billing')!r}")
        gpus = e.get("min_gpus")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise _problem(where, f"min_gpus must be a positive whole number, got {gpus!r}")
        cloud.append(CloudOffer(e["device"], _text(e, "provider", where), _text(e, "product", where), e["billing"],
                                _positive(e, "usd_per_gpu_hour", where), gpus, _checked(e, where),
                                _text(e, "source", where),
                                _url(e, "transcribed_from", where) if "transcribed_from" in e else None, e.get("note")))
    serverless = []
    for i, e in enumerate(data.get("serverless", [])):
        where = f"serverless[{i}]"
        if e.get("model") not in models:
            raise _problem(where, f"model {e.get('model')!r} is not in the model catalogue")
        serverless.append(ServerlessPrice(e["model"], _text(e, "provider", where), _text(e, "provider_model", where),
                                          _positive(e, "usd_per_1m_input", where), _positive(e, "usd_per_1m_output", where),
                                          _checked(e, where), _url(e, "source", where), e.get("note"),
                                          _url(e, "transcribed_from", where) if "transcribed_from" in e else None))
    return tuple(cloud), tuple(serverless)


def cloud_offers(device) -> list[CloudOffer]:
    """Every offer for ``device`` (a :class:`predictor.devices.Device`), cheapest first: the table's, and the
    catalogue's headline price unless the table lists the same price from the same page."""
    offers = [o for o in load_prices()[0] if o.device == device.id]
    if device.cloud_usd_per_hour:
        source = device.sources.get("cloud_price", "")
        if not any(o.source == source and abs(o.usd_per_gpu_hour - device.cloud_usd_per_hour) < 1e-9 for o in offers):
            note = device.notes.get("cloud_price", "")
            dates = re.findall(r"\d{4}-\d{2}-\d{2}", note)
            head = note.split(":")[0]
            provider = next((p for p in PROVIDERS if head.startswith(p)), "catalogue headline")
            product = head[len(provider):].strip(" ,") if provider != "catalogue headline" else (head or device.name)
            product = product.replace("on-demand", "").replace("  ", " ").strip(" ,")
            product = product.removeprefix("pod, ") or device.name
            count = re.search(r"\b(\d+)x ", product)  # a multi-GPU instance ("8x A100", "p3dn (8x V100"): rented whole
            offers.append(CloudOffer(device.id, provider, product, "on-demand", float(device.cloud_usd_per_hour),
                                     int(count.group(1)) if count else 1, dates[0] if dates else None, source,
                                     note=note or None, headline=True))
    return sorted(offers, key=lambda o: (o.usd_per_gpu_hour, o.provider))


def cheapest_rental(device, count: int = 1) -> tuple[float, CloudOffer] | None:
    """The cheapest dated on-demand offer of ``count`` of ``device`` (:func:`cloud_offers`; a spot or reserved one
    only where no on-demand one is listed): $ per hour for the GPUs rented (an offer of 8x only rents 8) and the
    offer; None where nobody offers the device."""
    offers = cloud_offers(device)
    if not offers:
        return None
    offers = [o for o in offers if o.billing == "on-demand"] or offers
    offer = min(offers, key=lambda o: o.usd_per_gpu_hour * max(count, o.min_gpus))
    return offer.usd_per_gpu_hour * max(count, offer.min_gpus), offer


def serverless_prices(model_id: str) -> list[ServerlessPrice]:
    return sorted((p for p in load_prices()[1] if p.model == model_id), key=lambda p: p.usd_per_1m_output)


def monthly_usd(usd_per_hour: float, hours_per_day: float) -> float:
    return usd_per_hour * hours_per_day * DAYS_PER_MONTH


def power_monthly_usd(watts: float, hours_per_day: float, usd_per_kwh: float) -> float:
    return watts / 1000.0 * hours_per_day * DAYS_PER_MONTH * usd_per_kwh


def break_even_months(purchase_usd: float, rent_monthly: float, power_monthly: float) -> float | None:
    """Months after which buying has cost less than renting (None when renting costs no more than the power)."""
    saving = rent_monthly - power_monthly
    return purchase_usd / saving if saving > 0 else None


def usd_per_1m_tokens(usd_per_hour: float, tokens_per_s: float) -> float | None:
    if not (tokens_per_s and math.isfinite(tokens_per_s) and tokens_per_s > 0):
        return None
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6


def serverless_usd(price: ServerlessPrice, input_tokens: float, output_tokens: float) -> float:
    return input_tokens / 1e6 * price.usd_per_1m_input + output_tokens / 1e6 * price.usd_per_1m_output
