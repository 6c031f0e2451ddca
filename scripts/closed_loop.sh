#!/usr/bin/env bash
# The CPU closed loop: measure small synthetic models with llama.cpp on this machine's CPU, fit the
# coefficients to them, predict a model size that was not in the fit, measure it, and check the error.
#
#   scripts/closed_loop.sh RUNS_DIR
#
# RUNS_DIR/fit holds the fitting runs, RUNS_DIR/heldout the held-out run, RUNS_DIR/coefficients the
# fitted table (coefficients.json/.csv/.md) and RUNS_DIR/report.md the measured-vs-predicted report.
# Sweeps resume, so a second call re-measures nothing. Exit status: benchcal check's (0 ok, 1 an error
# over its threshold), or the first failing step's. About 3-5 minutes on 2 cores (synthetic checkpoints
# are built once and cached under ~/.cache/benchcal).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 RUNS_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNS="$1"
mkdir -p "$RUNS"
RUNS="$(cd "$RUNS" && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
benchcal() { (cd "$ROOT" && "$PY" -m benchcal "$@"); }

SWEEPS="$RUNS/sweeps"
mkdir -p "$SWEEPS"
# Both sweeps measure with the same protocol: one [defaults] block, written by sweep_header.
sweep_header() {  # NAME DESCRIPTION
  cat <<EOF
name = "$1"
description = "$2"
timeout_s = 300

[defaults]
engine = "llama.cpp"
device = "cpu"
weights = "synthetic"
context = 1024
prompt_tokens = [64, 256]
gen_tokens = 48
reps = 5
warmup = 1
EOF
}
# Fitting set: three sizes, two weight formats, two layer counts of one architecture (so the fixed,
# per-layer and bandwidth terms can be told apart), two contexts (memory).
{
  sweep_header closed-loop-fit \
    "CPU closed loop, fitting set: synthetic smollm2-135m and qwen2.5-0.5b (full and 12 layers)."
  cat <<'EOF'

[[configs]]
model = "smollm2-135m"
quant = ["Q8_0", "Q4_0"]

[[configs]]
model = "smollm2-135m"
quant = "Q8_0"
context = 2048

[[configs]]
model = "qwen2.5-0.5b"
quant = ["Q8_0", "Q4_0"]

[[configs]]
model = "qwen2.5-0.5b"
quant = "Q8_0"
arch_overrides = { num_layers = 12 }
EOF
} > "$SWEEPS/closed-loop-fit.toml"
# Held out: a model size the fit never saw, in both formats and at two contexts. Three runs about half a
# minute apart, so that one disturbed stretch of this shared runner (a held-out decode once measured 31.3
# tok/s where three quiet runs gave 41.7-42.0) is one point of three, not the whole check.
{
  sweep_header closed-loop-heldout "CPU closed loop, held-out model: synthetic smollm2-360m."
  cat <<'EOF'

[[configs]]
model = "smollm2-360m"
quant = ["Q8_0", "Q4_0"]

[[configs]]
model = "smollm2-360m"
quant = "Q8_0"
context = 2048
EOF
} > "$SWEEPS/closed-loop-heldout.toml"

# Limits for the held-out model. A 2-core shared CI runner moves CPU timings by 10-30% between minutes,
# so these catch a broken loop (engine defaults miss decode here by 50-120%), not the last percent;
# calibration/accuracy.toml holds the real targets. Seen here with the single Q8_0 point over a dozen runs: decode
# 0.2-17.6% (once 42%: the disturbed run above), prefill 4.8-22%, TTFT 4.4-18%, memory 1.4-1.8%.
cat > "$SWEEPS/closed-loop-accuracy.toml" <<'EOF'
[thresholds]
decode_mape = 0.30
decode_p90 = 0.40
prefill_mape = 0.45
ttft_mape = 0.45
memory_rel = 0.03
memory_abs_mib = 256
EOF

echo "== measure the fitting set"
benchcal bench --gpu cpu --sweep "$SWEEPS/closed-loop-fit.toml" --runs-dir "$RUNS/fit"
echo "== calibrate"
benchcal calibrate --runs-dir "$RUNS/fit" --out "$RUNS/coefficients" --bootstrap 30
echo "== predict the held-out model with the fitted table"
benchcal predict --model smollm2-360m --gpu cpu --quant Q8_0 --ctx 1024 --prompt 256 \
  --coefficients "$RUNS/coefficients/coefficients.json"
echo "== measure it"
benchcal bench --gpu cpu --sweep "$SWEEPS/closed-loop-heldout.toml" --runs-dir "$RUNS/heldout"
benchcal report --runs-dir "$RUNS/fit" --runs-dir "$RUNS/heldout" \
  --coefficients "$RUNS/coefficients/coefficients.json" --format md --output "$RUNS/report.md"
echo "== check the held-out error"
benchcal check --runs-dir "$RUNS/heldout" --coefficients "$RUNS/coefficients/coefficients.json" \
  --thresholds "$SWEEPS/closed-loop-accuracy.toml" --baseline none --include-noisy
