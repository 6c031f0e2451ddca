"""The device catalogue: GPUs, accelerators and unified-memory machines the predictor knows.

Every figure comes from ``predictor/data/devices.json``, where each device carries the URL that backs
it (``sources``: figure -> URL) and, where a figure is derived, missing or uncertain, a one-line
explanation (``notes``: figure -> text). Units: memory in GiB (2**30 bytes) except the marketed
``memory_label_gb``; bandwidth in GB/s (10**9 bytes per second); compute in TFLOPS (10**12 FLOP/s,
dense, FP16/BF16 tensor inputs, FP32 accumulate where the vendor distinguishes); power in watts.

The host CPU is not a catalogue entry: its figures are measured or passed in, so it is built with
:func:`cpu_device`.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from predictor.engines import ENGINES, traits
from predictor.errors import BenchcalError, positive, suggest

DEVICES_PATH = Path(__file__).with_name("data") / "devices.json"

KINDS = ("gpu", "unified", "cpu")
VENDORS = ("nvidia", "amd", "intel", "apple", "huawei", "cambricon", "hygon", "metax", "kunlunxin",
           "moorethreads", "cpu")
# Words dropped before matching a name, so "NVIDIA GeForce RTX 4090" and "RTX 4090" meet.
_NOISE_WORDS = ("nvidia", "geforce", "(r)", "(tm)", "®", "™")
# Figures that may be null in the data file, each only with a note saying why.
NULLABLE_FIGURES = ("usable_gib", "bandwidth_gbs", "fp16_tflops", "tdp_w", "price_usd", "cloud_usd_per_hour")


@dataclass(frozen=True)
class Device:
    """One device. Memory in GiB, bandwidth in GB/s, compute in dense FP16 tensor TFLOPS.

    ``fp16_tflops`` is the FP16 tensor rate with FP32 accumulate; ``fp16_acc16_tflops`` the rate with FP16
    accumulate, given only where it differs (GeForce cards: twice). ``compute_units`` (SMs, CUs, Xe-cores) and
    ``boost_clock_mhz`` size the machinery that keeps memory requests in flight (:attr:`bytes_per_unit_cycle`).

    ``bandwidth_gbs`` and ``fp16_tflops`` are None only where no public source gives the figure;
    ``notes`` then says so. ``usable_gib`` is set only where a documented rule caps what an engine
    may allocate (macOS GPU wired limit, AMD Variable Graphics Memory); otherwise the predictor
    applies its own reserve to ``memory_gib``.
    """

    id: str
    name: str
    vendor: str
    kind: str
    memory_gib: float
    memory_label_gb: float
    usable_gib: float | None
    bandwidth_gbs: float | None
    fp16_tflops: float | None
    memory_type: str
    architecture: str
    form_factor: str
    tdp_w: float | None
    price_usd: float | None
    cloud_usd_per_hour: float | None
    engines: tuple[str, ...]
    aliases: tuple[str, ...]
    sources: dict[str, str] = field(hash=False)
    notes: dict[str, str] = field(default_factory=dict, hash=False)
    fp16_acc16_tflops: float | None = None  # dense FP16 tensor rate with FP16 accumulate, where it differs
    memory_node_gib: float | None = None  # a host CPU: the memory of the NUMA node its first CPU is on (vLLM's base)
    compute_units: int | None = None  # streaming multiprocessors (NVIDIA), compute units (AMD), Xe-cores (Intel)
    boost_clock_mhz: float | None = None  # the clock those units run at, boost
    cuda_total_gib: float | None = None  # the total the CUDA driver reports (vLLM's base), where a log states it

    @property
    def bytes_per_unit_cycle(self) -> float | None:
        """Peak bandwidth per compute unit per clock cycle (bytes): what each SM must keep in flight, per cycle of
        memory latency, for the kernels to reach the peak (None where the catalogue lacks a figure)."""
        if not self.bandwidth_gbs or not self.compute_units or not self.boost_clock_mhz:
            return None
        return self.bandwidth_gbs * 1e3 / (self.compute_units * self.boost_clock_mhz)

    def matmul_tflops(self, engine: str) -> float | None:
        """The peak an engine's prefill matmuls run against: llama.cpp's CUDA kernels multiply in FP16 with
        FP16 accumulate (twice the FP32-accumulate rate on GeForce cards); vLLM's BF16/FP16 GEMMs
        accumulate in FP32 (``fp16_tflops``)."""
        if traits(engine).fp16_accumulate and self.fp16_acc16_tflops is not None:
            return self.fp16_acc16_tflops
        return self.fp16_tflops

    @property
    def family(self) -> str:
        """Calibration fallback group, e.g. ``"hbm3/hopper"``."""
        return f"{self.memory_type}/{self.architecture}".lower()

    @property
    def memory_bytes(self) -> int:
        """Software-visible capacity in bytes."""
        return int(self.memory_gib * 2**30)

    def supports(self, engine: str) -> bool:
        """True when ``engine`` ("llama.cpp" or "vllm") runs on this device."""
        return engine in self.engines


def normalize_name(text: str) -> str:
    """Matching key for a device name: lower case, vendor noise words and punctuation removed.

    "NVIDIA GeForce RTX 4090", "rtx-4090" and "RTX 4090" all give ``"rtx4090"``.
    """
    lowered = unicodedata.normalize("NFKC", text).lower()
    for word in _NOISE_WORDS:
        lowered = lowered.replace(word, " ")
    return "".join(ch for ch in lowered if ch.isalnum())


def _device_from_record(record: dict) -> Device:
    """Build a Device from one JSON object, checking it against the catalogue rules."""
    did = record.get("id", "?")
    device = Device(
        id=record["id"], name=record["name"], vendor=record["vendor"], kind=record["kind"],
        memory_gib=float(record["memory_gib"]), memory_label_gb=float(record["memory_label_gb"]),
        usable_gib=_optional_float(record["usable_gib"]), bandwidth_gbs=_optional_float(record["bandwidth_gbs"]),
        fp16_tflops=_optional_float(record["fp16_tflops"]), memory_type=record["memory_type"],
        architecture=record["architecture"], form_factor=record["form_factor"],
        tdp_w=_optional_float(record["tdp_w"]), price_usd=_optional_float(record["price_usd"]),
        cloud_usd_per_hour=_optional_float(record["cloud_usd_per_hour"]),
        engines=tuple(record["engines"]), aliases=tuple(record["aliases"]),
        sources=dict(record["sources"]), notes=dict(record.get("notes", {})),
        fp16_acc16_tflops=_optional_float(record.get("fp16_acc16_tflops")),
        compute_units=record.get("compute_units"), boost_clock_mhz=_optional_float(record.get("boost_clock_mhz")),
        cuda_total_gib=_optional_float(record.get("cuda_total_gib")),
    )
    problems = _record_problems(device)
    if problems:
        raise ValueError(f"devices.json: device {did!r}: " + "; ".join(problems))
    return device


def _optional_float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def _record_problems(device: Device) -> list[str]:
    """Rule violations of one catalogue entry (empty when it is sound)."""
    problems = []
    if device.kind not in KINDS:
        problems.append(f"kind {device.kind!r} not in {KINDS}")
    if device.vendor not in VENDORS:
        problems.append(f"vendor {device.vendor!r} not in {VENDORS}")
    if not set(device.engines) <= set(ENGINES):
        problems.append(f"engines {device.engines} not within {ENGINES}")
    if device.memory_gib <= 0 or device.memory_label_gb <= 0:
        problems.append("memory must be positive")
    if "spec" not in device.sources and device.kind != "cpu":
        problems.append("no 'spec' source")
    for name in NULLABLE_FIGURES:
        value = getattr(device, name)
        if value is not None and value <= 0:
            problems.append(f"{name} must be positive or null")
    for name in ("bandwidth_gbs", "fp16_tflops"):
        if getattr(device, name) is None and name not in device.notes:
            problems.append(f"{name} is null without a note saying why")
    if device.cuda_total_gib is not None:
        if not 0 < device.cuda_total_gib <= device.memory_gib:
            problems.append("cuda_total_gib must be positive and at most memory_gib")
        if "cuda_total_gib" not in device.sources:
            problems.append("cuda_total_gib has no source")
    if device.fp16_acc16_tflops is not None:
        if device.fp16_acc16_tflops <= 0 or device.fp16_tflops is None or device.fp16_acc16_tflops < device.fp16_tflops:
            problems.append("fp16_acc16_tflops must be positive and at least fp16_tflops")
        if "fp16_acc16_tflops" not in device.sources:
            problems.append("fp16_acc16_tflops has no source")
    if (device.compute_units is None) != (device.boost_clock_mhz is None):
        problems.append("compute_units and boost_clock_mhz go together")
    if device.compute_units is not None:
        if not isinstance(device.compute_units, int) or isinstance(device.compute_units, bool) or device.compute_units <= 0:
            problems.append("compute_units must be a positive whole number")
        if device.boost_clock_mhz is None or device.boost_clock_mhz <= 0:
            problems.append("boost_clock_mhz must be positive")
        for name in ("compute_units", "boost_clock_mhz"):
            if name not in device.sources:
                problems.append(f"{name} has no source")
    if device.usable_gib is not None and device.usable_gib > device.memory_gib:
        problems.append("usable_gib exceeds memory_gib")
    return problems


@lru_cache(maxsize=1)
def _catalogue() -> tuple[Device, ...]:
    records = json.loads(DEVICES_PATH.read_text(encoding="utf-8"))
    devices = tuple(_device_from_record(record) for record in records)
    _name_index(devices)  # raises on ambiguous names
    return devices


def _name_index(devices: tuple[Device, ...]) -> dict[str, Device]:
    """Map every normalized id, name and alias to its device; two devices may not share a key."""
    index: dict[str, Device] = {}
    for device in devices:
        for text in (device.id, device.name, *device.aliases):
            key = normalize_name(text)
            other = index.get(key)
            if other is not None and other.id != device.id:
                raise ValueError(f"devices.json: name {text!r} matches both {other.id!r} and {device.id!r}")
            index[key] = device
    return index


@lru_cache(maxsize=1)
def _index() -> dict[str, Device]:
    return _name_index(_catalogue())


def load_devices() -> list[Device]:
    """Every catalogue device, in file order (parsed once, then cached)."""
    return list(_catalogue())


def device_ids() -> list[str]:
    """The short ids of all catalogue devices, in file order."""
    return [device.id for device in _catalogue()]


def resolve_device(spec: str) -> Device:
    """Find a device by short id, display name, alias, or the name NVML / llama-bench print.

    Matching ignores case, spaces and punctuation, and the words "NVIDIA" and "GeForce".
    Raises BenchcalError for "cpu" (build it with :func:`cpu_device`) and for unknown names.
    """
    key = normalize_name(spec)
    if key in ("cpu", "hostcpu"):
        raise BenchcalError("'cpu' is not a catalogue device: describe the host with "
                            "cpu_device(bandwidth_gbs, tflops, memory_gib)")
    device = _index().get(key)
    if device is None:
        ids = [d.id for d in _catalogue()]  # ids first: a name is suggested only where no id is close
        hint = suggest(spec, ids) or suggest(spec, [d.name for d in _catalogue()])
        raise BenchcalError(f"unknown GPU {spec!r}{hint}")
    return device


def cpu_device(bandwidth_gbs: float, tflops: float | None, memory_gib: float, name: str = "host CPU",
               device_id: str = "cpu", memory_node_gib: float | None = None) -> Device:
    """The host CPU as a device: bandwidth in GB/s, its matmul rate in TFLOPS, memory in GiB.

    The figures come from the caller (measured on the host by the harness's probes, or passed as flags), so
    the device has no sources. ``tflops`` is None where no rate is known (then no prefill is predicted).
    ``device_id`` is the host's calibration identity (``cpu-<model>-<isa>-<cores>c``, from
    ``harness.hostinfo``): coefficients are looked up per host, then for the CPU family ``dram/cpu``.
    ``memory_node_gib``: the memory of the NUMA node the host's first CPU is on, which vLLM's CPU backend reserves
    its share of (None: ``memory_gib``, a host of one node).
    """
    positive("CPU memory bandwidth (GB/s)", bandwidth_gbs)
    if tflops is not None:
        positive("CPU TFLOPS", tflops)
    positive("CPU memory (GiB)", memory_gib)
    return Device(
        id=device_id or "cpu", name=name, vendor="cpu", kind="cpu", memory_gib=float(memory_gib),
        memory_label_gb=float(memory_gib), usable_gib=None, bandwidth_gbs=float(bandwidth_gbs),
        fp16_tflops=None if tflops is None else float(tflops), memory_type="dram", architecture="cpu",
        form_factor="host", tdp_w=None, price_usd=None, cloud_usd_per_hour=None, engines=ENGINES, aliases=(),
        sources={}, notes={"spec": "figures measured on the host or given by the user",
                           **({} if tflops is not None else {"fp16_tflops": "no matmul rate measured on this host"})},
        memory_node_gib=float(memory_node_gib) if memory_node_gib else None,
    )
