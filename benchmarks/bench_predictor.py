"""Predictor speed: one model over every device x quant x context x batch x engine, cells per second.

    .venv/bin/python benchmarks/bench_predictor.py [--model qwen2.5-72b] [--repeat 5]

Pins BLAS/OpenMP to one thread (the target is one core). Prints the grid size, the best time of
``--repeat`` runs and cells/s, with and without the max-context search (a 24-step bisection).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

from predictor.devices import load_devices  # noqa: E402
from predictor.engines import ENGINES  # noqa: E402
from predictor.grid import sweep  # noqa: E402
from predictor.models import resolve_model  # noqa: E402
from predictor.quants import quant_formats  # noqa: E402

CONTEXTS = [1024 * 2**i for i in range(8)] + [3000, 6000, 12000, 24000, 48000, 96000, 20000, 40000]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def run(model: str, repeat: int, with_max_context: bool) -> tuple[int, float]:
    arch = resolve_model(model)
    devices = [d for d in load_devices() if d.kind != "cpu"]
    cells, best = 0, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = 0
        for engine in ENGINES:
            quants = [q for q in quant_formats() if engine in q.engines]
            devs = [d for d in devices if engine in d.engines]
            ctxs = [c for c in CONTEXTS if c <= arch.max_context]
            out = sweep(arch, engine, devs, quants, ctxs, BATCHES, with_max_context=with_max_context)
            n += out["decode_tok_s"].size
        best = min(best, time.perf_counter() - t0)
        cells = n
    return cells, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-72b")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    for with_max in (False, True):
        cells, secs = run(args.model, args.repeat, with_max)
        label = "with max-context search" if with_max else "memory + fit + decode + prefill + TTFT"
        print(f"{args.model}: {cells:,} cells in {secs * 1000:.1f} ms -> {cells / secs:,.0f} cells/s ({label})")


if __name__ == "__main__":
    main()
