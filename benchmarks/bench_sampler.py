"""Cost and reach of the memory sampler: decode tok/s with the sampler on vs off, and a 20 ms spike.

1. Overhead: llama.cpp (llama-cpp-python) decodes a synthetic model in this process; repetitions alternate
   between no sampler and an RSS sampler polling this process from a separate process at 200 Hz, which is
   how the harness watches an engine. Prints the median decode tok/s of each and the difference.
2. Reach: a child process holds an extra 256 MiB for 20 ms; the sampler must see it.

Usage::

    python benchmarks/bench_sampler.py [--model smollm2-135m] [--quant Q4_0] [--reps 8] [--gen 64] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.samplers import RssTreeSampler  # noqa: E402

WATCHER = """
import json, sys
from harness.samplers import RssTreeSampler
sampler = RssTreeSampler(int(sys.argv[1]), interval_s=float(sys.argv[2])).start()
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(sampler.stop()), flush=True)
"""

SPIKE = """
import sys, time
time.sleep(0.3)
block = bytearray(256 * 2**20)
time.sleep(0.020)
del block
time.sleep(0.3)
"""


def start_watcher(pid: int, interval_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(pid), str(interval_s)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env)
    assert watcher.stdout.readline().strip() == "ready"
    return watcher


def stop_watcher(watcher: subprocess.Popen) -> dict:
    watcher.stdin.write("\n")
    watcher.stdin.flush()
    report = json.loads(watcher.stdout.readline())
    watcher.wait(timeout=10)
    return report


def decode_tok_s(engine, n_gen: int, rng) -> float:
    timing = engine.measure_decode(engine.random_prompt(32, rng), n_gen)
    times = timing.token_times_s
    return (len(times) - 1) / (times[-1] - times[0])


def overhead(args: argparse.Namespace) -> dict:
    import random

    from harness import synthetic
    from harness.engines.llama_cpp.engine import LlamaCppEngine

    path = synthetic.synthetic_gguf(args.model, args.quant)
    config = {"context": 512, "batch": 1, "kv_dtype": "f16",
              "engine_options": {"threads": args.threads, "n_gpu_layers": 0}}
    engine = LlamaCppEngine()
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)  # llama.cpp's load log
    try:
        engine.load(config, str(path))
    finally:
        os.dup2(saved, 2)
    rng = random.Random(0)
    decode_tok_s(engine, args.gen, rng)  # warm-up
    off, on, reports = [], [], []
    for _ in range(args.reps):
        off.append(decode_tok_s(engine, args.gen, rng))
        watcher = start_watcher(os.getpid(), args.interval)
        on.append(decode_tok_s(engine, args.gen, rng))
        reports.append(stop_watcher(watcher))
    engine.close()
    median_off, median_on = statistics.median(off), statistics.median(on)
    return {
        "model": args.model, "quant": args.quant, "threads": args.threads, "gen_tokens": args.gen,
        "decode_tok_s_sampler_off": round(median_off, 2),
        "decode_tok_s_sampler_on": round(median_on, 2),
        "difference_percent": round((median_on - median_off) / median_off * 100.0, 2),
        "samples_off": [round(v, 2) for v in off],
        "samples_on": [round(v, 2) for v in on],
        "sampler_hz": round(statistics.median(r["sample_hz"] for r in reports), 1),
    }


def spike(interval_s: float) -> dict:
    child = subprocess.Popen([sys.executable, "-c", SPIKE])
    sampler = RssTreeSampler(child.pid, interval_s=interval_s).start()
    time.sleep(0.15)
    before = sampler.last_bytes
    child.wait(timeout=30)
    report = sampler.stop()
    extra = (report["peak_bytes"] or 0) - before
    return {"spike_bytes": 256 * 2**20, "spike_ms": 20, "seen_extra_bytes": extra,
            "caught": extra >= 0.95 * 256 * 2**20, "sample_hz": round(report["sample_hz"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quant", default="Q4_0")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None,
                        help="engine threads (default: the harness's default, which leaves the sampler a core)")
    parser.add_argument("--interval", type=float, default=0.005, help="sampler interval in seconds (default 0.005)")
    args = parser.parse_args()
    if args.threads is None:
        from harness.engines.setup import default_threads

        args.threads = default_threads()
    print(json.dumps({"overhead": overhead(args), "spike": spike(args.interval)}, indent=1))


if __name__ == "__main__":
    main()
