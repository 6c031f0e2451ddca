"""Memory samplers: each polls in its own thread and reports the peak, when it happened and how often it looked.

- :class:`RssTreeSampler`: resident set size (bytes) of a process and all its descendants (psutil).
- :class:`NvmlSampler`: GPU memory through NVML (``nvidia-ml-py``, imported lazily): per-process used
  memory of the engine's processes when NVML can see them, else device used minus the baseline taken before
  the engine started (NVML per-process figures fail inside PID-namespaced containers). Processes on the GPU
  that are not the engine's are reported as foreign.

Both know nothing of engines: they watch process ids. Reports use bytes, seconds and Hz.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

DEFAULT_INTERVAL_S = 0.005  # 200 Hz target; each sample costs well under a millisecond
CHILDREN_REFRESH_S = 0.25  # how often the process tree is re-listed


class _PollingSampler:
    """Shared thread loop: call ``_sample()`` every ``interval_s`` until stopped; track the peak."""

    source = ""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.sample_count = 0
        self.peak_bytes = 0
        self.peak_time_s: float | None = None
        self.last_bytes = 0

    def start(self) -> _PollingSampler:
        self.started_at = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name=f"{type(self).__name__}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_tick = time.perf_counter()
        while not self._stop.is_set():
            self.sample_once()
            next_tick += self.interval_s
            delay = next_tick - time.perf_counter()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_tick = time.perf_counter()

    def sample_once(self) -> int | None:
        """Take one sample now; returns the bytes seen (None when nothing could be read)."""
        value = self._sample()
        if value is None:
            return None
        now = time.perf_counter()
        with self._lock:
            self.sample_count += 1
            self.last_bytes = value
            if value > self.peak_bytes or self.peak_time_s is None:
                self.peak_bytes = value
                self.peak_time_s = now - self.started_at
        return value

    def _sample(self) -> int | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> dict[str, Any]:
        """Stop the thread (one last sample first) and return the report."""
        if self._thread is not None and not self._stop.is_set():
            self.sample_once()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.stopped_at = time.perf_counter()
        return self.report()

    def report(self) -> dict[str, Any]:
        duration_s = max((self.stopped_at or time.perf_counter()) - self.started_at, 1e-9)
        return {
            "peak_bytes": int(self.peak_bytes) if self.sample_count else None,
            "peak_source": self.source,
            "peak_time_s": self.peak_time_s,
            "sample_count": self.sample_count,
            "sample_hz": self.sample_count / duration_s,
            "duration_s": duration_s,
        }


class RssTreeSampler(_PollingSampler):
    """Peak resident memory (bytes) of process ``pid`` plus all its descendants."""

    source = "rss_tree"

    def __init__(self, pid: int, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__(interval_s)
        self.pid = pid
        self._processes: dict[int, psutil.Process] = {}
        self._listed_at = 0.0
        self.baseline_bytes: int | None = None

    def _refresh(self) -> None:
        try:
            root = psutil.Process(self.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        self._processes = {p.pid: self._processes.get(p.pid, p) for p in tree}
        self._listed_at = time.perf_counter()

    def tree_pids(self) -> set[int]:
        """Process ids of the watched tree as last listed."""
        return set(self._processes)

    def _sample(self) -> int | None:
        if time.perf_counter() - self._listed_at > CHILDREN_REFRESH_S or not self._processes:
            self._refresh()
        total = 0
        seen = False
        for proc in list(self._processes.values()):
            try:
                total += proc.memory_info().rss
                seen = True
            except psutil.Error:
                continue
        return total if seen else None

    def mark_baseline(self) -> int | None:
        """Record the tree's current RSS as the baseline (e.g. after imports, before the model loads)."""
        self.baseline_bytes = self.sample_once()
        return self.baseline_bytes

    def report(self) -> dict[str, Any]:
        out = super().report()
        out["baseline_bytes"] = self.baseline_bytes
        return out


def nvml_available() -> bool:
    """True when nvidia-ml-py imports and NVML finds at least one GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


class NvmlSampler(_PollingSampler):
    """GPU memory of the engine's processes on one device, per process when visible, else device minus baseline.

    ``pids`` returns the engine's current process ids (called every sample; cheap). The baseline (device
    used, bytes) and the processes already on the GPU are read at construction, before the engine starts.
    """

    def __init__(self, pids: Callable[[], Iterable[int]], device_index: int = 0,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__(interval_s)
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self.device_index = device_index
        self._pids = pids
        self.baseline_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        self.baseline_processes = {pid: used for pid, used in self._processes()}
        self.per_process_seen = False
        self.device_peak_bytes = 0
        self.foreign: dict[int, int] = {}

    @property
    def source(self) -> str:  # type: ignore[override]
        return "nvml_process" if self.per_process_seen else "nvml_device"

    def _processes(self) -> list[tuple[int, int | None]]:
        nvml = self._nvml
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except nvml.NVMLError:
            return []
        return [(int(p.pid), _used(p)) for p in running]

    def _sample(self) -> int | None:
        nvml = self._nvml
        try:
            device_used = int(nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except nvml.NVMLError:
            return None
        ours = set(self._pids())
        process_bytes = 0
        for pid, used in self._processes():
            if pid in ours and used is not None:
                self.per_process_seen = True
                process_bytes += used
            elif pid not in ours:
                self.foreign[pid] = max(self.foreign.get(pid, 0), used or 0)
        device_bytes = max(device_used - self.baseline_bytes, 0)
        self.device_peak_bytes = max(self.device_peak_bytes, device_bytes)
        return process_bytes if self.per_process_seen else device_bytes

    def foreign_processes(self) -> dict[int, int]:
        """Processes on the GPU that are not the engine's, pid -> peak used bytes.

        When NVML never attributed memory to the engine's pids (PID namespaces), a process that appeared
        after the engine started is most likely the engine under its host pid, so only processes already
        there at baseline count as foreign.
        """
        if self.per_process_seen:
            return dict(self.foreign)
        return {pid: used for pid, used in self.foreign.items() if pid in self.baseline_processes}

    def report(self) -> dict[str, Any]:
        out = super().report()
        out.update({
            "baseline_bytes": self.baseline_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "foreign_processes": foreign_process_list(self.foreign_processes()),
        })
        return out

    def stop(self) -> dict[str, Any]:
        out = super().stop()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        return out


def _used(process: Any) -> int | None:
    used = getattr(process, "usedGpuMemory", None)
    # NVML reports NVML_VALUE_NOT_AVAILABLE (an all-ones value) when it cannot attribute memory
    if used is None or used >= 2**63:
        return None
    return int(used)


def foreign_process_list(foreign: dict[int, int]) -> list[dict[str, Any]]:
    """``[{"pid", "name", "used_bytes"}]`` for processes on the GPU that are not the engine's."""
    out = []
    for pid, used in sorted(foreign.items()):
        try:
            name = psutil.Process(pid).name()
        except psutil.Error:
            name = None
        out.append({"pid": pid, "name": name, "used_bytes": used})
    return out


def gpu_snapshot(device_index: int = 0) -> dict[str, Any] | None:
    """Device facts for provenance (name, UUID, driver, CUDA, clocks, power limit, memory); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        snap: dict[str, Any] = {
            "device_name": _text(pynvml.nvmlDeviceGetName(handle)),
            "device_uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            "memory_used_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        }
        snap["cuda"] = _optional(lambda: _cuda_version(pynvml.nvmlSystemGetCudaDriverVersion_v2()))
        snap["clocks_mhz"] = _optional(lambda: {
            "sm_max": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_max": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "sm": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        })
        snap["power_limit_w"] = _optional(lambda: pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0)
        snap["device_count"] = int(pynvml.nvmlDeviceGetCount())
        return snap
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _cuda_version(code: int) -> str:
    """NVML's CUDA driver version integer (e.g. 12040) as ``12.4``."""
    return f"{code // 1000}.{(code % 1000) // 10}"
