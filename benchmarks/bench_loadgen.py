"""The load generator's own overhead: how many streamed events per second it takes in, and how late it timestamps
them, against a stub streaming server on loopback in another process.

The stub (an aiohttp server, in a child process) answers each ``/v1/completions`` request with ``--tokens``
events ``--gap-ms`` apart, each carrying the ``time.perf_counter()`` at which it was written (CLOCK_MONOTONIC, the
same clock in both processes on Linux). The client (:func:`harness.serving.loadgen.run_level`) keeps
``--concurrency`` streams in flight; an event's timestamp error is the arrival time the client records for it (the
kernel's receive time of its bytes, :mod:`harness.serving.httpstream`) minus its send time: the stub's write and
the loopback transfer, and whatever the client adds. Prints the events per second the client took in and the error's p50, p99
and maximum; the targets are >= 2,000 events (tokens) per second at 64 streams with a p99 below 1 ms.

Usage::

    python benchmarks/bench_loadgen.py [--concurrency 64] [--requests 256] [--tokens 64] [--gap-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.records import percentile  # noqa: E402
from harness.serving.loadgen import level_summary, run_level  # noqa: E402
from harness.serving.server import free_port  # noqa: E402

STUB = """
import asyncio, json, sys, time
from aiohttp import web

TOKENS, GAP = int(sys.argv[2]), float(sys.argv[3]) / 1000.0

async def completions(request):
    body = await request.json()
    response = web.StreamResponse()
    await response.prepare(request)
    for i in range(int(body.get("max_tokens", TOKENS))):
        if i:
            await asyncio.sleep(GAP)
        event = {"choices": [{"text": "x", "finish_reason": None}], "sent": time.perf_counter()}
        await response.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")
    await response.write(b"data: [DONE]\\n\\n")
    return response

async def models(request):
    return web.json_response({"data": []})

app = web.Application()
app.router.add_post("/v1/completions", completions)
app.router.add_get("/v1/models", models)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _wait(port: int, timeout_s: float = 20.0) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the stub server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    args = parser.parse_args()
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port), str(args.tokens), str(args.gap_ms)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait(port)
        url = f"http://127.0.0.1:{port}/v1/completions"
        results, wall = asyncio.run(run_level(url, lambda i: {"max_tokens": args.tokens}, requests=args.requests,
                                              concurrency=args.concurrency, keep_events=True))
    finally:
        stub.terminate()
        stub.wait(10)
    errors_ms = [1000.0 * (arrived - event["sent"]) for r in results for arrived, event in (r.events or [])]
    ordered = sorted(errors_ms)
    summary = level_summary(results, wall, prompt_tokens=0)
    print(json.dumps({
        "concurrency": args.concurrency, "requests": args.requests, "tokens_per_request": args.tokens,
        "gap_ms": args.gap_ms, "completed": summary["completed"], "errors": summary["errors"],
        "events_per_s": round(summary["output_tok_s"] or 0.0, 1), "wall_s": round(wall, 3),
        "timestamp_error_ms": {"p50": round(percentile(ordered, 50), 3), "p99": round(percentile(ordered, 99), 3),
                               "max": round(max(errors_ms), 3), "n": len(errors_ms)},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
