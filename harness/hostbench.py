"""Host (and device) microbenchmarks: memory bandwidth and matmul throughput, cached per machine for a day.

- Host bandwidth: a STREAM-style copy (``b[:] = a``) over arrays far larger than the caches, run in one
  thread per core on disjoint slices; bytes moved = 2 x array bytes (read + write), like STREAM's Copy.
  Best of several repetitions, in GB/s (10^9 bytes/s).
- FP32 throughput: numpy (BLAS) square matmul, ``2 N^3`` FLOPs, best of several, in GFLOP/s.
- Device bandwidth (GPUs, when torch with CUDA is importable): device-to-device tensor copy, same counting.

Results are cached as JSON under ``$BENCHCAL_CACHE/hostbench/`` for 24 hours, keyed by host name (and
device UUID for devices). :func:`host_profile` is what the predictor's CPU device and run provenance use.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

CACHE_TTL_S = 24 * 3600
COPY_BYTES = 256 * 2**20  # per array; well beyond any last-level cache
MATMUL_N = 1024
REPEATS = 5


def _cache_file(name: str) -> Path:
    from harness.synthetic import cache_dir

    return cache_dir() / "hostbench" / f"{name}.json"


def _read_cache(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if time.time() - float(data.get("measured_at_unix", 0)) > CACHE_TTL_S:
        return None
    return data


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def copy_bandwidth_gbs(array_bytes: int = COPY_BYTES, threads: int | None = None, repeats: int = REPEATS) -> float:
    """Host memory bandwidth in GB/s from a threaded array copy (2 x bytes per copy)."""
    threads = threads or usable_cores()
    array_bytes = int(min(array_bytes, psutil.virtual_memory().available / 8))
    n = max(array_bytes // 8, threads * 1024)
    source = np.ones(n, dtype=np.float64)
    target = np.empty_like(source)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def copy(part: slice) -> None:
        np.copyto(target[part], source[part])

    best_s = float("inf")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(copy, slices))  # touch the pages first
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(copy, slices))
            best_s = min(best_s, time.perf_counter() - start)
    return 2 * source.nbytes / best_s / 1e9


def matmul_gflops(n: int = MATMUL_N, repeats: int = REPEATS) -> float:
    """FP32 matmul throughput in GFLOP/s (``2 n^3`` per product, best of ``repeats``)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up
    best_s = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best_s = min(best_s, time.perf_counter() - start)
    return 2 * n**3 / best_s / 1e9


def host_profile(refresh: bool = False) -> dict[str, Any]:
    """``{bandwidth_gbs, fp32_gflops, cores, memory_gib, cpu_model, hostname, measured_at}`` (cached 24 h)."""
    hostname = socket.gethostname()
    path = _cache_file(f"host-{hostname}")
    cached = None if refresh else _read_cache(path)
    if cached is not None:
        return cached
    profile = {
        "bandwidth_gbs": round(copy_bandwidth_gbs(), 2),
        "fp32_gflops": round(matmul_gflops(), 1),
        "cores": usable_cores(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "cpu_model": cpu_model(),
        "hostname": hostname,
        "method": "threaded numpy copy, 2 x 256 MiB arrays, 2 x bytes per copy, best of 5; numpy fp32 matmul",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "measured_at_unix": time.time(),
    }
    _write_cache(path, profile)
    return profile


def device_bandwidth_gbs(device_index: int = 0, device_uuid: str | None = None, refresh: bool = False) -> float | None:
    """GPU memory bandwidth in GB/s from a device-to-device torch copy; None without torch/CUDA (cached 24 h)."""
    path = _cache_file(f"device-{socket.gethostname()}-{device_uuid or device_index}")
    cached = None if refresh else _read_cache(path)
    if cached is not None:
        return cached.get("bandwidth_gbs")
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    device = torch.device(f"cuda:{device_index}")
    n_bytes = 1024 * 2**20
    source = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize(device)
    best_s = float("inf")
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        torch.cuda.synchronize(device)
        best_s = min(best_s, start.elapsed_time(end) / 1000.0)
    del source, target
    torch.cuda.empty_cache()
    bandwidth = round(2 * n_bytes / best_s / 1e9, 1)
    _write_cache(path, {"bandwidth_gbs": bandwidth, "measured_at_unix": time.time(),
                        "method": "torch device-to-device copy of 1 GiB, 2 x bytes, best of 10"})
    return bandwidth


def main() -> None:
    """Print the host profile as JSON (``python -m harness.hostbench``)."""
    print(json.dumps(host_profile(refresh=True), indent=1))


if __name__ == "__main__":
    main()
