"""NVML sampler logic (baseline subtraction, per-process fallback, foreign processes) against a stand-in
NVML module; the real NVML is exercised by scripts/device_check.py on a GPU machine."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from harness import samplers


class FakeNvml(types.ModuleType):
    """Just enough of pynvml: one device whose used memory and process list the test sets."""

    class NVMLError(Exception):
        pass

    def __init__(self, used: int, processes: list[tuple[int, int | None]]):
        super().__init__("pynvml")
        self.used = used
        self.processes = processes

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used, total=80 * 2**30)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes]


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml(used=1000, processes=[(50, 300)])  # a process already on the GPU
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_per_process_memory_is_used_when_nvml_sees_the_engine(nvml):
    sampler = samplers.NvmlSampler(lambda: {100, 101}, 0)
    nvml.used, nvml.processes = 5000, [(50, 300), (100, 3000), (101, 500)]
    assert sampler.sample_once() == 3500
    nvml.used, nvml.processes = 3000, [(50, 300), (100, 1200)]
    sampler.sample_once()
    report = sampler.report()
    assert report["peak_source"] == "nvml_process" and report["peak_bytes"] == 3500
    assert report["baseline_bytes"] == 1000 and report["device_peak_bytes"] == 4000
    assert [p["pid"] for p in report["foreign_processes"]] == [50]


def test_device_minus_baseline_when_nvml_cannot_see_the_engines_pids(nvml):
    sampler = samplers.NvmlSampler(lambda: {100}, 0)
    nvml.used, nvml.processes = 4200, [(50, 300), (7777, 3200)]  # the engine under its host pid
    sampler.sample_once()
    report = sampler.report()
    assert report["peak_source"] == "nvml_device" and report["peak_bytes"] == 3200
    assert [p["pid"] for p in report["foreign_processes"]] == [50]  # 7777 came with the engine


def test_unavailable_per_process_figure_is_not_attribution(nvml):
    sampler = samplers.NvmlSampler(lambda: {100}, 0)
    nvml.used, nvml.processes = 2000, [(100, 2**64 - 1)]  # NVML_VALUE_NOT_AVAILABLE
    sampler.sample_once()
    assert sampler.report()["peak_source"] == "nvml_device"


def test_nvml_missing_means_no_gpu_sampling(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert samplers.nvml_available() is False
    assert samplers.gpu_snapshot(0) is None
