#!/usr/bin/env bash
# Serving under load, closed loop on the CPU: measure both engines' servers at 1, 2, 4 and 8 requests in flight
# (harness/sweeps/cpu-serving.toml), fit the serving model's server terms on 1, 2 and 4, and print how well it
# predicts 8 (output tokens/s and TTFT p50), with the in-sample fit.
#
#   scripts/serving_loop.sh RUNS_DIR
#
# About 3.5-4.5 minutes on 2 cores (interleaved rounds: 8 of llama.cpp's levels, 16 of vLLM's). Prints the figures;
# fails only when a step fails (a noisy 2-core machine is no place for an accuracy gate on latencies).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 RUNS_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
RUNS="$(cd "$1" && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3

start=$(date +%s)
(cd "$ROOT" && "$PY" -m benchcal bench --gpu cpu --sweep cpu-serving --runs-dir "$RUNS")
(cd "$ROOT" && "$PY" -m calibration.serving "$RUNS")
echo "serving loop: $(( $(date +%s) - start )) s"
