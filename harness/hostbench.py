"""Host (and device) microbenchmarks: the engine's own bandwidth and matmul rates, cached per host.

The CPU figures predictions and fits use come from llama.cpp's own kernels, not from numpy's BLAS (whose
rate depends on the BLAS build and on variables such as ``OPENBLAS_CORETYPE``) nor from a copy loop with
more threads than the engine runs: one run of the probe configuration (:data:`PROBE`, a synthetic
SmolLM2-135M in F16, a 256-token prompt then 32 generated tokens, the harness's default threads).

- Matmul rate: its prefill, in GFLOP/s of the weight matmuls (``predictor.throughput.prefill_matmul_flops``).
- Bandwidth: its decode, in GB/s of the weights a step streams (``decode_weight_bytes_per_step``: the F16
  layers and the tied output head), what the engine's threads draw from memory.
- Copy bandwidth (kept beside them, and the bandwidth figure where llama.cpp cannot run): a STREAM-style
  copy (``b[:] = a``, numpy's copy loop, no BLAS) over arrays far larger than the caches, one thread per core
  on disjoint slices; bytes moved = 2 x array bytes (read + write). Best of several repetitions.
- Device bandwidth (GPUs, when torch with CUDA is importable): device-to-device tensor copy, same counting.

A probe whose repetitions spread more than :data:`DISTURBED_SPREAD` (robust relative spread) is repeated;
one that stays disturbed is used, flagged, and cached for an hour only (:data:`DISTURBED_TTL_S`: a busy
machine is probed again an hour later, not by every command). Steady results are cached as JSON
under ``$BENCHCAL_CACHE/hostbench/`` for a week, keyed by the host's calibration id
(:func:`harness.hostinfo.host_identity`) and, for the matmul rate, the engine version.
:func:`host_profile` is what the predictor's CPU device and run provenance use.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from harness.hostinfo import cpu_model, host_identity, usable_cores

CACHE_TTL_S = 7 * 24 * 3600
DISTURBED_TTL_S = 3600  # a disturbed figure is reused for an hour, then probed again
COPY_BYTES = 256 * 2**20  # per array; well beyond any last-level cache
REPEATS = 5
ATTEMPTS = 3  # probe rounds before a disturbed figure is accepted (cached for DISTURBED_TTL_S)
DISTURBED_SPREAD = 0.05  # 1.4826 x MAD / median of the repetitions
# The probe: F16 weights take llamafile's float GEMM (prefill) and plain F16 dot products (decode) on every ISA.
PROBE = {"model": "smollm2-135m", "quant": "F16", "context": 1024, "prompt_tokens": 256, "gen_tokens": 32,
         "reps": 5, "warmup": 1, "flash_attn": False}
PROBE_METHOD = ("llama.cpp F16 prefill of synthetic smollm2-135m, 256 tokens, default threads: 2 x weight-matmul "
                "parameters x tokens / s, median of 5")
PROBE_BANDWIDTH_METHOD = ("llama.cpp F16 decode of synthetic smollm2-135m after a 256-token prompt, default threads: "
                          "weight bytes per step x tokens / s, median of 5")
BANDWIDTH_METHOD = "threaded numpy copy, 2 x 256 MiB arrays, 2 x bytes per copy, best of 5"

__all__ = ["cpu_model", "usable_cores", "host_profile", "copy_bandwidth_gbs", "engine_matmul_gflops",
           "probe_bandwidth_from_tok_s", "probe_gflops_from_tok_s", "robust_spread", "device_bandwidth_gbs"]


def _cache_file(name: str) -> Path:
    from harness.synthetic import cache_dir

    return cache_dir() / "hostbench" / f"{name}.json"


def _read_cache(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    disturbed = data.get("matmul_disturbed") or data.get("bandwidth_disturbed")
    if time.time() - float(data.get("measured_at_unix", 0)) > (DISTURBED_TTL_S if disturbed else CACHE_TTL_S):
        return None
    return data


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def robust_spread(samples: Sequence[float]) -> float:
    """1.4826 x median absolute deviation / median: the repetitions' relative spread, robust to one outlier."""
    values = [float(x) for x in samples if x and x > 0]
    if len(values) < 2:
        return float("inf")
    median = statistics.median(values)
    return 1.4826 * statistics.median(abs(x - median) for x in values) / median


def _steady(measure: Callable[[], Any], attempts: int = ATTEMPTS,
            spread: Callable[[Any], float] = robust_spread) -> tuple[Any, bool]:
    """The first round of ``measure`` whose ``spread`` is within :data:`DISTURBED_SPREAD`, else the steadiest
    round with ``disturbed`` True."""
    rounds = []
    for _ in range(attempts):
        rounds.append(measure())
        if spread(rounds[-1]) <= DISTURBED_SPREAD:
            return rounds[-1], False
    return min(rounds, key=spread), True


def copy_bandwidth_samples(array_bytes: int = COPY_BYTES, threads: int | None = None,
                           repeats: int = REPEATS) -> list[float]:
    """Host memory bandwidth samples in GB/s from a threaded array copy (2 x bytes per copy)."""
    threads = threads or usable_cores()
    array_bytes = int(min(array_bytes, psutil.virtual_memory().available / 8))
    n = max(array_bytes // 8, threads * 1024)
    source = np.ones(n, dtype=np.float64)
    target = np.empty_like(source)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    slices = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def copy(part: slice) -> None:
        np.copyto(target[part], source[part])

    samples = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(copy, slices))  # touch the pages first
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(copy, slices))
            samples.append(2 * source.nbytes / (time.perf_counter() - start) / 1e9)
    return samples


def copy_bandwidth_gbs(array_bytes: int = COPY_BYTES, threads: int | None = None, repeats: int = REPEATS) -> float:
    """Host memory bandwidth in GB/s: the best of ``repeats`` threaded copies."""
    return max(copy_bandwidth_samples(array_bytes, threads, repeats))


def probe_config() -> dict[str, Any]:
    """The run config of the matmul probe (a normal harness config: prefill only, no decode)."""
    return {"model": PROBE["model"], "engine": "llama.cpp", "device": "cpu", "quant": PROBE["quant"],
            "weights": "synthetic", "context": PROBE["context"], "prompt_tokens": [PROBE["prompt_tokens"]],
            "gen_tokens": PROBE["gen_tokens"], "reps": PROBE["reps"], "warmup": PROBE["warmup"],
            "engine_options": {"flash_attn": PROBE["flash_attn"]}}


def probe_gflops_from_tok_s(prefill_tok_s: float) -> float:
    """The probe's matmul rate in GFLOP/s for a measured prefill rate of the probe configuration (tokens/s).

    The same arithmetic turns a stored run of the probe configuration into the figure (calibration's
    records of hosts measured before the probe existed)."""
    from harness.synthetic import resolve_arch
    from predictor.throughput import prefill_matmul_flops

    n = PROBE["prompt_tokens"]
    flops = float(prefill_matmul_flops(resolve_arch(PROBE["model"]), n))
    return flops * float(prefill_tok_s) / n / 1e9


def probe_bandwidth_from_tok_s(decode_tok_s: float) -> float:
    """The probe's bandwidth in GB/s for a measured decode rate of the probe configuration (tokens/s): the
    bytes of F16 weights one step streams, times the steps per second."""
    from harness.synthetic import resolve_arch, resolve_spec, weights_bytes
    from predictor.throughput import decode_weight_bytes_per_step

    arch = resolve_arch(PROBE["model"])
    total = weights_bytes(resolve_spec(PROBE["model"]), PROBE["quant"])
    return float(decode_weight_bytes_per_step(arch, total, 1, 16.0)) * float(decode_tok_s) / 1e9


def engine_probe_samples(timeout_s: float = 300.0) -> tuple[list[float], list[float], dict[str, Any]]:
    """Run the probe in the harness's engine child: GFLOP/s and GB/s per repetition, and the engine's version."""
    from harness.engines.runner import run_engine
    from harness.measurements import build_measurements
    from harness.runconfig import log_path_for, prepare_config, prepare_weights

    cfg = prepare_config(probe_config())
    weights, _info = prepare_weights(cfg)
    run = run_engine(cfg, weights, log_path_for(cfg), timeout_s=timeout_s)
    if run.interrupted:  # Ctrl-C while probing stops the command, as during a run
        raise KeyboardInterrupt
    if run.status != "ok":
        raise RuntimeError(f"matmul probe {run.status}: {run.reason}")
    measurements = build_measurements(run)
    prefill = measurements["prefill"][0]["prefill_tok_s"]["samples"]
    decode = measurements["decode"]["decode_tok_s"]["samples"]
    return ([probe_gflops_from_tok_s(x) for x in prefill], [probe_bandwidth_from_tok_s(x) for x in decode],
            dict(run.version or {}))


_PROBED: dict[str, dict[str, Any]] = {}  # this process's probe results, disturbed ones included


def engine_matmul_gflops(refresh: bool = False) -> dict[str, Any]:
    """``{matmul_gflops, engine_bandwidth_gbs, *_samples, matmul_disturbed, ...}`` for this host from the engine
    probe; both figures None (with ``matmul_error``) when llama.cpp cannot run here. A disturbed result (either
    rate) is cached for :data:`DISTURBED_TTL_S` only."""
    identity = host_identity()
    try:
        from importlib.metadata import version

        engine = version("llama_cpp_python")
    except Exception:
        engine = "none"
    key = f"matmul-{identity['host_id']}-{engine}"
    path = _cache_file(key)
    cached = None if refresh else (_PROBED.get(key) or _read_cache(path))
    if cached is not None:
        return cached
    try:  # a round is steady when both rates are
        (samples, bandwidth_samples, found), disturbed = _steady(
            engine_probe_samples, spread=lambda r: max(robust_spread(r[0]), robust_spread(r[1])))
    except Exception as exc:  # no llama-cpp-python, or the engine failed: no engine figures, said so
        _PROBED[key] = {"matmul_gflops": None, "matmul_error": f"{type(exc).__name__}: {exc}",
                        "matmul_method": PROBE_METHOD}
        return _PROBED[key]
    result = {
        "matmul_gflops": round(statistics.median(samples), 2), "matmul_samples": [round(x, 2) for x in samples],
        "matmul_spread": round(robust_spread(samples), 4), "matmul_disturbed": disturbed,
        "engine_bandwidth_gbs": round(statistics.median(bandwidth_samples), 2),
        "engine_bandwidth_samples": [round(x, 2) for x in bandwidth_samples],
        "engine_bandwidth_spread": round(robust_spread(bandwidth_samples), 4),
        "matmul_method": PROBE_METHOD, "bandwidth_method": PROBE_BANDWIDTH_METHOD,
        "engine_version": found.get("engine_version"), "measured_at_unix": time.time(),
    }
    _write_cache(path, result)
    _PROBED[key] = result
    return result


def host_profile(refresh: bool = False) -> dict[str, Any]:
    """``{bandwidth_gbs, matmul_gflops, copy_bandwidth_gbs, cores, memory_gib, cpu_model, cpu_flags, isa,
    host_id, ...}``: ``bandwidth_gbs`` is the engine probe's (the copy loop's where llama.cpp cannot run).

    Each probe is cached for a week when steady, an hour when not (see the module docstring); ``probe_disturbed``
    lists the probes (``engine``, ``copy``) whose figures were taken from a disturbed round."""
    identity = host_identity()
    key = f"bandwidth-{identity['host_id']}"
    path = _cache_file(key)
    bandwidth = None if refresh else (_PROBED.get(key) or _read_cache(path))
    if bandwidth is None:
        samples, disturbed = _steady(copy_bandwidth_samples)
        bandwidth = {"bandwidth_gbs": round(max(samples), 2), "bandwidth_samples": [round(x, 2) for x in samples],
                     "bandwidth_disturbed": disturbed, "bandwidth_method": BANDWIDTH_METHOD,
                     "measured_at_unix": time.time()}
        _write_cache(path, bandwidth)
        _PROBED[key] = bandwidth
    matmul = engine_matmul_gflops(refresh)
    engine_bw = matmul.get("engine_bandwidth_gbs")
    return {
        **identity,
        "bandwidth_gbs": engine_bw or bandwidth["bandwidth_gbs"],
        "copy_bandwidth_gbs": bandwidth["bandwidth_gbs"],
        "matmul_gflops": matmul.get("matmul_gflops"),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
        "hostname": socket.gethostname(),
        "method": (f"bandwidth: {PROBE_BANDWIDTH_METHOD if engine_bw else BANDWIDTH_METHOD}; matmul: {PROBE_METHOD}; "
                   f"copy bandwidth: {BANDWIDTH_METHOD}"),
        "probe_disturbed": (["engine"] if matmul.get("matmul_disturbed") else [])
        + (["copy"] if bandwidth.get("bandwidth_disturbed") else []),
        "matmul_error": matmul.get("matmul_error"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(bandwidth["measured_at_unix"]))),
    }


def host_cpu_device(engine: str, host: Mapping[str, Any] | None = None, table: Any = None,
                    bandwidth_gbs: float | None = None, tflops: float | None = None) -> Any:
    """The host CPU as the predictor's device, under its calibration id (``host_id``).

    Bandwidth and matmul rate: the ones given, else the figures its calibration was fitted against (a host the
    coefficient ``table`` describes, default the shipped table with the user's fit over it), else ``host``'s probed
    figures (probed now when ``host`` is None)."""
    from predictor.coefficients import default_coefficients
    from predictor.devices import cpu_device
    from predictor.errors import BenchcalError

    known = dict(host) if host else host_identity()
    host_id = known.get("host_id")
    try:
        fitted = ((table or default_coefficients()).host_figures(engine, host_id) if host_id else None) or {}
    except BenchcalError:  # an unreadable user table: predict from the probes
        fitted = {}
    bandwidth = bandwidth_gbs or fitted.get("bandwidth_gbs")
    gflops = tflops * 1000.0 if tflops else fitted.get("matmul_gflops")
    if bandwidth is None or gflops is None:
        probed = known if known.get("bandwidth_gbs") else host_profile()
        bandwidth = bandwidth or probed.get("bandwidth_gbs")
        gflops = gflops or probed.get("matmul_gflops")
    memory_gib = known.get("memory_gib") or psutil.virtual_memory().total / 2**30
    return cpu_device(bandwidth_gbs=bandwidth, tflops=gflops / 1000.0 if gflops else None, memory_gib=memory_gib,
                      name=known.get("cpu_model") or "host CPU", device_id=host_id or "cpu",
                      memory_node_gib=memory_node_gib())


def memory_node_gib(root: str = "/sys/devices/system") -> float | None:
    """The memory (GiB) of the NUMA node this process's first allowed CPU is on, as vLLM's CPU worker reads it
    (``vllm/utils/cpu_resource_utils.py``: ``node<N>/meminfo`` MemTotal); None where the host exposes no nodes."""
    import glob

    try:
        cpu = min(os.sched_getaffinity(0))
    except (AttributeError, OSError, ValueError):
        cpu = 0
    nodes = sorted(glob.glob(os.path.join(root, "cpu", f"cpu{cpu}", "node[0-9]*")))
    node = os.path.basename(nodes[0])[4:] if nodes else "0"
    try:
        with open(os.path.join(root, "node", f"node{node}", "meminfo")) as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    return int(parts[3]) * 1024 / 2**30
    except (OSError, ValueError):
        return None
    return None


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
