"""GPU checks of the NVML memory sampler, for an NVIDIA machine with PyTorch and nvidia-ml-py.

1. Accuracy: allocate known sizes with torch (1, 4, 16 GiB); the sampler's reading must move by the
   allocated bytes within 1 %.
2. Reach: an 8 GiB allocation held for 30 ms, then released to the driver (``empty_cache``), must show in
   the sampler's peak.
3. Overhead: a GPU-bound loop of small matmuls (a stand-in for decode steps) timed with the sampler off and
   on, interleaved; plus the sampler's own rate and the CPU time this process used.

Prints a JSON summary (also written to ``$OUT/device_check.json`` when ``OUT`` is set); exit status 0 when
every check passes, 1 otherwise. Usage: ``python3 scripts/device_check.py [--device 0]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.samplers import NvmlSampler, gpu_snapshot  # noqa: E402

GIB = 2**30
TOLERANCE = 0.01


def settle(sampler: NvmlSampler, seconds: float = 0.3) -> int:
    """Let the sampler take readings for ``seconds``; return its latest reading (bytes)."""
    time.sleep(seconds)
    return int(sampler.last_bytes)


def accuracy(torch, device, sampler: NvmlSampler) -> list[dict]:
    results = []
    for size_gib in (1, 4, 16):
        before = settle(sampler)
        block = torch.empty(size_gib * GIB, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        during = settle(sampler)
        del block
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        seen = during - before
        error = (seen - size_gib * GIB) / (size_gib * GIB)
        results.append({"allocated_bytes": size_gib * GIB, "seen_bytes": seen, "relative_error": round(error, 5),
                        "ok": abs(error) <= TOLERANCE})
    return results


def spike(torch, device, index: int, pids) -> dict:
    sampler = NvmlSampler(pids, index).start()
    before = settle(sampler)
    block = torch.empty(8 * GIB, dtype=torch.uint8, device=device)
    torch.cuda.synchronize(device)
    time.sleep(0.030)
    del block
    torch.cuda.empty_cache()
    torch.cuda.synchronize(device)
    time.sleep(0.2)
    report = sampler.stop()
    extra = (report["peak_bytes"] or 0) - before
    return {"spike_bytes": 8 * GIB, "spike_ms": 30, "seen_extra_bytes": extra,
            "ok": extra >= (1 - TOLERANCE) * 8 * GIB, "sample_hz": round(report["sample_hz"], 1),
            "peak_source": report["peak_source"]}


def step_loop_s(torch, device, steps: int = 400) -> float:
    """Seconds per step of a decode-like loop: a 4096x4096 bf16 matvec-ish matmul plus a sync."""
    a = torch.randn(8, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        (a @ b).sum().item()
    return (time.perf_counter() - start) / steps


def overhead(torch, device, index: int, pids, rounds: int = 5) -> dict:
    step_loop_s(torch, device, 50)  # warm-up
    off, on, rates = [], [], []
    cpu_start = time.process_time()
    wall_start = time.perf_counter()
    for _ in range(rounds):
        off.append(step_loop_s(torch, device))
        sampler = NvmlSampler(pids, index).start()
        on.append(step_loop_s(torch, device))
        rates.append(sampler.stop()["sample_hz"])
    cpu_share = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    median_off, median_on = statistics.median(off), statistics.median(on)
    return {"step_ms_sampler_off": round(median_off * 1000, 4), "step_ms_sampler_on": round(median_on * 1000, 4),
            "slowdown_percent": round((median_on - median_off) / median_off * 100, 2),
            "sampler_hz": round(statistics.median(rates), 1), "process_cpu_share": round(cpu_share, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=int, default=0, help="CUDA / NVML device index (default 0)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible to torch"}))
        return 1
    device = torch.device(f"cuda:{args.device}")
    torch.empty(1, device=device)  # create the CUDA context before the baseline
    torch.cuda.synchronize(device)
    pids = lambda: {os.getpid()}  # noqa: E731
    sampler = NvmlSampler(pids, args.device).start()
    summary = {"device": gpu_snapshot(args.device), "accuracy": accuracy(torch, device, sampler)}
    base_report = sampler.stop()
    summary["sampler"] = {"peak_source": base_report["peak_source"], "sample_hz": round(base_report["sample_hz"], 1),
                          "foreign_processes": base_report["foreign_processes"]}
    summary["spike"] = spike(torch, device, args.device, pids)
    summary["overhead"] = overhead(torch, device, args.device, pids)
    summary["ok"] = all(r["ok"] for r in summary["accuracy"]) and summary["spike"]["ok"]
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "device_check.json").write_text(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
