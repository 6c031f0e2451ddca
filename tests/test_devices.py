"""The device catalogue: data rules, name resolution, the host-CPU device."""

from __future__ import annotations

import json

import pytest

from predictor import devices as dev
from predictor.devices import Device, cpu_device, device_ids, load_devices, normalize_name, resolve_device
from predictor.errors import BenchcalError

# Names that public "can I run it" calculators list for their hardware menus, plus the other cards
# the catalogue is expected to cover. Each must resolve to a catalogue device.
LISTED_DEVICE_NAMES = [
    "RTX 3060 12GB", "RTX 4060 Ti 16GB", "RTX 4070 Ti Super", "RTX 4080 Super", "RTX 5060 Ti 16GB",
    "RTX 5070 12GB", "RTX 5070 Ti", "RTX 5080", "RTX 3090", "RTX 4090", "RTX 4090 D", "RTX 5090",
    "RTX 5090 D", "RTX A6000", "RTX 6000 Ada", "RTX PRO 6000 Blackwell (96GB)", "DGX Spark (GB10 128GB)",
    "A40 48GB", "L20 48GB", "L40S 48GB", "L4", "A800 80GB SXM", "A100 80GB SXM", "A100 40GB",
    "A100 PCIe 80GB", "A100 PCIe 40GB", "H800 80GB SXM", "H100 80GB SXM", "H100 PCIe", "H100 NVL",
    "H20 96GB HBM3", "H20 141GB HBM3e", "H200 141GB SXM", "H200 NVL", "B200 180GB",
    "B300 288GB Blackwell Ultra", "Ascend 910B 64GB (昇腾)", "Ascend 910C 128GB (昇腾)",
    "Atlas 300I Duo 96GB (310P)", "MLU590 80GB (寒武纪思元)", "DCU K100-AI 64GB (海光深算)",
    "MetaX C500 64GB (沐曦曦云)", "Kunlunxin P800 64GB (昆仑芯)", "MTT S4000 48GB (摩尔线程)",
    "Radeon RX 7900 XTX 24GB", "Radeon AI PRO R9700 32GB", "Ryzen AI Max+ 395 128GB", "Ryzen AI Max+ 395 64GB",
    "Instinct MI300X 192GB", "Instinct MI325X 256GB", "Instinct MI355X 288GB", "Arc Pro B60 24GB",
    "Gaudi 3 128GB HBM2e", "Mac mini M4 Pro 64GB", "MacBook Pro M4 Max 128GB", "Mac Studio M2 Ultra 192GB",
    "Mac Studio M3 Ultra 256GB", "Mac Studio M3 Ultra 512GB", "M1 Max 64GB", "M2 Max 96GB", "M3 Max 128GB",
    "RTX 2080 Ti", "RTX 3060 Ti", "RTX 3070", "RTX 3080 10GB", "RTX 3080 12GB", "RTX 3080 Ti", "RTX 3090 Ti",
    "RTX 4060", "RTX 4060 Ti 8GB", "RTX 4070", "RTX 4070 Super", "RTX 4070 Ti", "RTX 4080", "RTX 5060",
    "RTX 5060 Ti 8GB", "RTX A4000", "RTX A5000", "RTX 4000 Ada", "RTX 4500 Ada", "RTX 5000 Ada", "T4",
    "V100",
]


def test_catalogue_holds_at_least_sixty_devices():
    assert len(load_devices()) >= 60


def test_device_ids_are_unique():
    ids = device_ids()
    assert len(ids) == len(set(ids))


def test_every_device_has_positive_memory_and_a_spec_url():
    for device in load_devices():
        assert device.memory_gib > 0 and device.memory_label_gb > 0, device.id
        assert device.sources.get("spec", "").startswith("https://"), device.id


def test_every_source_is_an_https_url():
    for device in load_devices():
        for figure, url in device.sources.items():
            assert url.startswith("https://"), (device.id, figure, url)


@pytest.mark.parametrize("figure", ["bandwidth_gbs", "fp16_tflops"])
def test_key_figures_are_positive_or_null_with_a_reason(figure):
    for device in load_devices():
        value = getattr(device, figure)
        if value is None:
            assert device.notes.get(figure), f"{device.id}: {figure} is null without a note"
        else:
            assert value > 0, device.id


def test_most_devices_have_both_key_figures():
    complete = [d for d in load_devices() if d.bandwidth_gbs and d.fp16_tflops]
    assert len(complete) >= 60


def test_engines_are_llama_cpp_or_vllm():
    for device in load_devices():
        assert set(device.engines) <= {"llama.cpp", "vllm"}, device.id


def test_kinds_and_vendors_are_from_the_fixed_lists():
    for device in load_devices():
        assert device.kind in ("gpu", "unified"), device.id
        assert device.vendor in dev.VENDORS, device.id


def test_no_two_devices_share_a_name_after_normalization():
    owner: dict[str, str] = {}
    for device in load_devices():
        for text in (device.id, device.name, *device.aliases):
            key = normalize_name(text)
            assert owner.setdefault(key, device.id) == device.id, (text, owner[key], device.id)


def test_a_shared_name_in_the_data_is_rejected():
    first, second = load_devices()[:2]
    clash = Device(**{**first.__dict__, "id": "clash", "aliases": (second.aliases[0],)})
    with pytest.raises(ValueError, match="matches both"):
        dev._name_index((first, second, clash))


def test_usable_memory_is_set_only_on_unified_devices_and_never_exceeds_capacity():
    for device in load_devices():
        if device.usable_gib is not None:
            assert device.kind == "unified", device.id
            assert device.usable_gib <= device.memory_gib, device.id


def test_macos_wired_limit_gives_three_quarters_of_large_macs():
    assert resolve_device("mac-studio-m2-ultra-192gb").usable_gib == pytest.approx(144)
    assert resolve_device("macbook-pro-m2-max-96gb").usable_gib == pytest.approx(72)
    assert resolve_device("macbook-pro-m1-pro-32gb").usable_gib == pytest.approx(32 * 2 / 3, abs=0.01)


def test_strix_halo_usable_memory_follows_the_variable_graphics_memory_split():
    assert resolve_device("ryzen-ai-max-395-128gb").usable_gib == 96
    assert resolve_device("ryzen-ai-max-395-64gb").usable_gib == 48


@pytest.mark.parametrize(("device_id", "expected_gib"), [
    ("h200-sxm", 140.40), ("h100-sxm", 79.65), ("a100-sxm-80gb", 80.0), ("l4", 22.49),
])
def test_memory_is_the_capacity_nvml_reports(device_id, expected_gib):
    assert resolve_device(device_id).memory_gib == pytest.approx(expected_gib, abs=0.01)


@pytest.mark.parametrize("name", LISTED_DEVICE_NAMES)
def test_listed_device_names_resolve(name):
    assert resolve_device(name).id in device_ids()


@pytest.mark.parametrize(("spec", "device_id"), [
    ("l4", "l4"), ("h100-sxm", "h100-sxm"), ("rtx-4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm"), ("NVIDIA L4", "l4"),
    ("Tesla T4", "t4"), ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"), ("NVIDIA H20-3e", "h20-141gb"),
    ("AMD Radeon RX 7900 XTX", "rx-7900-xtx"), ("Intel(R) Arc(TM) Pro B60 Graphics", "arc-pro-b60"),
    ("Apple M4 Max", "macbook-pro-m4-max-128gb"),
])
def test_short_ids_and_driver_names_resolve(spec, device_id):
    assert resolve_device(spec).id == device_id


@pytest.mark.parametrize("spec", ["rtx 4090", "RTX4090", "geforce rtx-4090", "  nvidia   GEFORCE rtx 4090 "])
def test_resolution_ignores_case_spacing_punctuation_and_vendor_prefixes(spec):
    assert resolve_device(spec).id == "rtx-4090"


def test_unknown_device_names_the_closest_matches():
    with pytest.raises(BenchcalError, match=r"unknown GPU 'rtx-9090' \(did you mean: .*rtx-\d090"):
        resolve_device("rtx-9090")


def test_cpu_is_not_a_catalogue_device():
    with pytest.raises(BenchcalError, match="cpu_device"):
        resolve_device("cpu")


def test_cpu_device_carries_the_callers_figures():
    host = cpu_device(bandwidth_gbs=89.6, tflops=1.2, memory_gib=64, name="Xeon host")
    assert (host.id, host.kind, host.name) == ("cpu", "cpu", "Xeon host")
    assert (host.bandwidth_gbs, host.fp16_tflops, host.memory_gib) == (89.6, 1.2, 64)
    assert host.engines == ("llama.cpp", "vllm")
    assert host.family == "dram/cpu"


@pytest.mark.parametrize("kwargs", [
    {"bandwidth_gbs": 0, "tflops": 1, "memory_gib": 8},
    {"bandwidth_gbs": 50, "tflops": -1, "memory_gib": 8},
    {"bandwidth_gbs": 50, "tflops": 1, "memory_gib": 0},
])
def test_cpu_device_rejects_non_positive_figures(kwargs):
    with pytest.raises(BenchcalError):
        cpu_device(**kwargs)


def test_family_joins_memory_type_and_architecture_in_lower_case():
    assert resolve_device("h100-sxm").family == "hbm3/hopper"
    assert resolve_device("rtx-4090").family == "gddr6x/ada"


def test_devices_are_hashable_and_loading_is_cached():
    assert load_devices() == load_devices()
    assert len({d for d in load_devices()}) == len(load_devices())
    assert resolve_device("l4").memory_bytes == int(resolve_device("l4").memory_gib * 2**30)


def test_every_purchase_price_has_a_source_and_a_note():
    for device in load_devices():
        if device.price_usd is not None:
            assert device.sources.get("price", "").startswith("https://"), device.id
            assert device.notes.get("price"), device.id


def test_every_cloud_rate_has_a_provider_page_and_names_the_provider():
    providers = ("Lambda", "RunPod", "DigitalOcean", "Vast.ai", "Google Cloud", "AWS", "Azure", "Vultr")
    for device in load_devices():
        if device.cloud_usd_per_hour is not None:
            assert device.sources.get("cloud_price", "").startswith("https://"), device.id
            assert any(name in device.notes.get("cloud_price", "") for name in providers), device.id


def test_cloud_rates_are_per_gpu_hour_magnitudes():
    rates = [d.cloud_usd_per_hour for d in load_devices() if d.cloud_usd_per_hour is not None]
    assert len(rates) >= 10
    assert all(0.1 < rate < 20 for rate in rates)


def test_data_center_prices_are_marked_as_street_or_list_prices():
    for device in load_devices():
        if device.price_usd is not None and device.form_factor in ("sxm", "oam"):
            assert "street price" in device.notes["price"] or "list price" in device.notes["price"], device.id


def test_cloud_rate_is_cheaper_per_hour_than_the_part_costs_to_buy():
    for device in load_devices():
        if device.price_usd is not None and device.cloud_usd_per_hour is not None:
            assert device.cloud_usd_per_hour * 100 < device.price_usd, device.id


@pytest.mark.parametrize(("device_id", "tflops"), [
    ("macbook-pro-m1-max-64gb", 10.62), ("mac-studio-m2-ultra-192gb", 27.2), ("rtx-pro-6000", 503.8),
])
def test_filled_fp16_figures_carry_their_source(device_id, tflops):
    device = resolve_device(device_id)
    assert device.fp16_tflops == pytest.approx(tflops)
    assert device.sources["fp16_tflops"].startswith("https://")


def test_fp16_accumulate_rates_are_geforce_only_sourced_and_twice_the_fp32_accumulate_rate():
    listed = [d for d in load_devices() if d.fp16_acc16_tflops is not None]
    assert len(listed) >= 20
    for d in listed:
        assert d.vendor == "nvidia" and d.form_factor == "desktop-card", d.id
        assert d.fp16_acc16_tflops == pytest.approx(2 * d.fp16_tflops, abs=0.05), d.id
        assert d.sources["fp16_acc16_tflops"].startswith("https://") and "fp16_acc16_tflops" in d.notes


def test_an_fp16_accumulate_rate_below_the_fp32_accumulate_rate_is_refused():
    record = next(r for r in json.loads(dev.DEVICES_PATH.read_text()) if r["id"] == "rtx-4090")
    record = {**record, "fp16_acc16_tflops": 100.0}
    with pytest.raises(ValueError, match="fp16_acc16_tflops"):
        dev._device_from_record(record)


def test_compute_units_and_clocks_are_sourced_and_cover_the_discrete_gpus_with_a_public_figure():
    listed = [d for d in load_devices() if d.compute_units is not None]
    gpus = [d for d in load_devices() if d.kind == "gpu"]
    assert len(listed) >= 60 and all(d.kind == "gpu" for d in listed)
    # the discrete GPUs without a figure are the accelerators whose vendors publish no unit count and clock
    assert {d.vendor for d in gpus if d.compute_units is None} <= {"huawei", "cambricon", "hygon", "metax", "kunlunxin",
                                                                   "moorethreads", "intel", "nvidia"}
    for d in listed:
        assert d.sources["compute_units"].startswith("https://") and "compute_units" in d.notes, d.id
        assert d.boost_clock_mhz and 900 <= d.boost_clock_mhz <= 3200, d.id


@pytest.mark.parametrize(("device_id", "units", "mhz", "bytes_per_cycle"), [
    ("a100-sxm-80gb", 108, 1410, 13.39),  # 2,039 GB/s over 108 SMs at 1.41 GHz
    ("v100-pcie-16gb", 80, 1380, 8.15),
    ("rtx-4090", 128, 2520, 3.12),
])
def test_bytes_per_unit_cycle_is_the_peak_bandwidth_each_sm_must_carry(device_id, units, mhz, bytes_per_cycle):
    d = resolve_device(device_id)
    assert (d.compute_units, d.boost_clock_mhz) == (units, mhz)
    assert d.bytes_per_unit_cycle == pytest.approx(bytes_per_cycle, abs=0.01)
    assert resolve_device("ascend-910b").bytes_per_unit_cycle is None  # no figure: no ratio


@pytest.mark.parametrize("change", [{"compute_units": 108.5}, {"compute_units": 0}, {"boost_clock_mhz": None},
                                    {"sources_drop": "compute_units"}])
def test_a_unit_count_that_is_not_whole_positive_paired_and_sourced_is_refused(change):
    record = json.loads(json.dumps(next(r for r in json.loads(dev.DEVICES_PATH.read_text()) if r["id"] == "a100-sxm-80gb")))
    if "sources_drop" in change:
        del record["sources"][change["sources_drop"]]
    else:
        record.update(change)
    with pytest.raises(ValueError, match="compute_units|boost_clock_mhz"):
        dev._device_from_record(record)


def test_a_number_or_a_chip_suggests_the_devices_that_hold_it_first():
    from predictor.devices import resolve_device
    from predictor.errors import BenchcalError

    with pytest.raises(BenchcalError, match=r"did you mean: rtx-3090, rtx-3090-ti\?\)"):  # not b300 beside them
        resolve_device("3090")
    with pytest.raises(BenchcalError, match=r"did you mean: macbook-pro-m3-max-64gb, macbook-pro-m3-max-128gb\?\)"):
        resolve_device("m3-max")
