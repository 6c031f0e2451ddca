#!/usr/bin/env bash
# The GPU evidence run: one command on a lent NVIDIA machine (H200) that measures what the predictor is
# calibrated on and brings the run records back. docs/gpu-evidence.md says how to call it and what to do
# with its results.
#
# usage: OUT=/some/folder bash scripts/device_calibrate.sh
#
# Steps (each under a time limit taken from one overall budget, each logged to $OUT/device_calibrate.log):
#   1. facts        nvidia-smi -q and NVML (driver, CUDA, clocks, power limit, memory) -> gpu.json
#   2. check        scripts/device_check.py (NVML sampler against known torch allocations) -> device_check.json
#   3. llama        the carried CUDA build of llama.cpp (or a build on the machine), the carried llama_cpp
#                   and gguf packages, the machine's CUDA runtime and cuBLAS; proves llama_cpp imports
#   4. sweep        harness/sweeps/h200-calibration.toml through `benchcal bench --sweep`, one model at a
#                   time: its synthetic checkpoints are generated (timed), measured, then deleted; a model
#                   whose estimated time does not fit what is left of the budget is skipped
#   5. fallback     only when llama.cpp cannot run (or DEVICE_FORCE_FALLBACK=1): the transformers engine
#                   on random-weight Qwen2.5 models, so NVML, TTFT and the records are still checked
#   6. pack         runs.tar.gz (records, to untar into runs/), logs.tar.gz, summary.json (after every
#                   model too, so a run cut short still returns what it measured)
#
# $OUT ends with at most 7 files: device_calibrate.log, nvidia-smi-q.txt, gpu.json, device_check.json,
# runs.tar.gz, logs.tar.gz, summary.json. Exit status: 0 when at least one run was measured ok, else 1.
#
# Environment (defaults in brackets):
#   OUT                   folder for the results [required, except in a dry run]
#   DEVICE_BUDGET_S       seconds for the whole script [500; dry run 240]
#   DEVICE_PYTHON         interpreter [python3; dry run .venv/bin/python]
#   DEVICE_WORK           scratch folder: libraries, checkpoints, records [/tmp/benchcal-device]
#   DEVICE_CARRY          folder that travelled with the tree [.carry]
#   DEVICE_SITE           llama_cpp + gguf + diskcache packages [$DEVICE_CARRY/site]
#   LLAMA_CUDA_TARBALL    prebuilt libraries [$DEVICE_CARRY/llama-cuda-sm90.tar.zst]
#   DEVICE_SWEEP          sweep file [harness/sweeps/h200-calibration.toml]
#   DEVICE_GEN_MBS        checkpoint-writing speed assumed before one is measured, MB/s [400]
#   DEVICE_RESUME_RUNS    a runs.tar.gz from an earlier call: its ok configs are not measured again
#   DEVICE_FORCE_FALLBACK 1: run step 5 even when llama.cpp works
#   DEVICE_FALLBACK_MODELS  models for step 5 [qwen2.5-0.5b qwen2.5-7b qwen2.5-32b]
#   DEVICE_DRY_RUN        1: on a CPU machine, in about a minute: CPU llama.cpp libraries from .venv packed
#                         like the CUDA tarball (unless LLAMA_CUDA_TARBALL is set), the site folder prepared
#                         from .venv, two tiny models, and the H200 sweep planned (not run) so its split and
#                         estimates are checked
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT" || exit 2
# shellcheck source=scripts/device_env.sh
source "$REPO_ROOT/scripts/device_env.sh"

DRY="${DEVICE_DRY_RUN:-0}"
if [ "$DRY" = 1 ]; then
    OUT="${OUT:-$(mktemp -d /tmp/benchcal-dry-out.XXXXXX)}"
    PY="${DEVICE_PYTHON:-$REPO_ROOT/.venv/bin/python}"
    BUDGET_S="${DEVICE_BUDGET_S:-240}"
    WORK="${DEVICE_WORK:-$(mktemp -d /tmp/benchcal-dry-work.XXXXXX)}"
    GPU_FLAG="cpu"
else
    : "${OUT:?set OUT to the folder whose files come back}"
    PY="${DEVICE_PYTHON:-python3}"
    BUDGET_S="${DEVICE_BUDGET_S:-500}"
    WORK="${DEVICE_WORK:-/tmp/benchcal-device}"
    GPU_FLAG="auto"
fi
CARRY="${DEVICE_CARRY:-$REPO_ROOT/.carry}"
SITE="${DEVICE_SITE:-$CARRY/site}"
TARBALL="${LLAMA_CUDA_TARBALL:-$CARRY/llama-cuda-sm90.tar.zst}"
SWEEP="${DEVICE_SWEEP:-$REPO_ROOT/harness/sweeps/h200-calibration.toml}"
GEN_MBS="${DEVICE_GEN_MBS:-400}"
FALLBACK_MODELS="${DEVICE_FALLBACK_MODELS:-qwen2.5-0.5b qwen2.5-7b qwen2.5-32b}"
RESERVE_S=20  # kept back for packing the results
DISK_MARGIN_BYTES=$((2 * 1024 * 1024 * 1024))

T0=$SECONDS
DEADLINE=$((T0 + BUDGET_S))
mkdir -p "$OUT" "$WORK/logs" "$WORK/plan"
OUT="$(cd "$OUT" && pwd)"
WORK="$(cd "$WORK" && pwd)"
LOG="$OUT/device_calibrate.log"
STEPS="$WORK/steps.tsv"     # step  status  seconds  note
GEN="$WORK/generation.tsv"  # model  quant  bytes  seconds
RUNS="$WORK/runs"
export BENCHCAL_CACHE="$WORK/cache"
export PYTHONUNBUFFERED=1
: >"$STEPS"
: >"$GEN"
: >"$LOG"
mkdir -p "$RUNS" "$BENCHCAL_CACHE"
LLAMA_OK=0
LLAMA_SOURCE="none"

log() { printf '[%4ds] %s\n' "$((SECONDS - T0))" "$*" | tee -a "$LOG" >&2; }
record_step() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$STEPS"; }
seconds_left() { echo $((DEADLINE - SECONDS - RESERVE_S)); }

# limit_for WANTED: WANTED seconds, or what is left of the budget if that is less; at least 1 (timeout 0
# would mean no limit at all).
limit_for() {
    local left limit
    left="$(seconds_left)"
    limit="$1"
    [ "$left" -lt "$limit" ] && limit="$left"
    [ "$limit" -lt 1 ] && limit=1
    echo "$limit"
}

# ----------------------------------------------------------------------------------------------- 1. facts

gpu_facts() {
    local started=$SECONDS limit
    limit="$(limit_for 60)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        timeout 20 nvidia-smi -q >"$OUT/nvidia-smi-q.txt" 2>&1 || log "nvidia-smi -q failed"
    else
        echo "nvidia-smi not found" >"$OUT/nvidia-smi-q.txt"
    fi
    timeout "$limit" "$PY" - "$OUT/gpu.json" "$WORK" >>"$WORK/logs/facts.log" 2>&1 <<'PY'
import json, os, platform, shutil, subprocess, sys, time

facts = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": sys.version.split()[0],
         "platform": platform.platform(), "cores": os.cpu_count()}
try:
    import psutil
    facts["host_memory_bytes"] = psutil.virtual_memory().total
except ImportError:
    pass
facts["work_disk_free_bytes"] = shutil.disk_usage(sys.argv[2]).free
try:
    facts["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
except (OSError, subprocess.SubprocessError):
    facts["nvcc"] = None


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def ask(name, call):
    try:
        facts[name] = call()
    except Exception as exc:  # each figure on its own: some are not supported everywhere
        facts[name] = None
        facts.setdefault("nvml_unsupported", {})[name] = f"{type(exc).__name__}: {exc}"


try:
    import pynvml as nv
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    ask("device_count", nv.nvmlDeviceGetCount)
    ask("name", lambda: text(nv.nvmlDeviceGetName(h)))
    ask("uuid", lambda: text(nv.nvmlDeviceGetUUID(h)))
    ask("driver", lambda: text(nv.nvmlSystemGetDriverVersion()))
    ask("cuda_driver_version", lambda: nv.nvmlSystemGetCudaDriverVersion_v2())
    ask("memory_total_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).total)
    ask("memory_used_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
    ask("memory_bus_width_bits", lambda: nv.nvmlDeviceGetMemoryBusWidth(h))
    for clock, key in ((nv.NVML_CLOCK_SM, "sm"), (nv.NVML_CLOCK_MEM, "mem"), (nv.NVML_CLOCK_GRAPHICS, "graphics")):
        ask(f"clock_{key}_mhz", lambda c=clock: nv.nvmlDeviceGetClockInfo(h, c))
        ask(f"clock_{key}_max_mhz", lambda c=clock: nv.nvmlDeviceGetMaxClockInfo(h, c))
        ask(f"clock_{key}_applications_mhz", lambda c=clock: nv.nvmlDeviceGetApplicationsClock(h, c))
    ask("power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0)
    ask("power_limit_default_w", lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0)
    ask("power_limit_enforced_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
    ask("power_draw_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
    ask("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
    ask("performance_state", lambda: nv.nvmlDeviceGetPerformanceState(h))
    ask("persistence_mode", lambda: nv.nvmlDeviceGetPersistenceMode(h))
    ask("compute_mode", lambda: nv.nvmlDeviceGetComputeMode(h))
    ask("mig_mode", lambda: list(nv.nvmlDeviceGetMigMode(h)))
    ask("ecc_mode", lambda: list(nv.nvmlDeviceGetEccMode(h)))
    ask("pcie_link", lambda: [nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)])
    ask("compute_capability", lambda: list(nv.nvmlDeviceGetCudaComputeCapability(h)))
    ask("processes", lambda: [{"pid": p.pid, "used_bytes": p.usedGpuMemory}
                              for p in nv.nvmlDeviceGetComputeRunningProcesses(h)])
    nv.nvmlShutdown()
except Exception as exc:
    facts["nvml_error"] = f"{type(exc).__name__}: {exc}"
try:
    import torch
    facts["torch"] = torch.__version__
    facts["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts["multiprocessors"] = props.multi_processor_count
        facts["l2_cache_bytes"] = getattr(props, "L2_cache_size", None)
except ImportError:
    facts["torch"] = None
with open(sys.argv[1], "w") as handle:
    json.dump(facts, handle, indent=1, default=str)
print(json.dumps({k: facts.get(k) for k in ("name", "driver", "cuda_driver_version", "memory_total_bytes",
                                             "clock_sm_max_mhz", "power_limit_w", "torch")}))
PY
    local rc=$?
    tail -n 1 "$WORK/logs/facts.log" | tee -a "$LOG" >&2
    record_step facts "$([ $rc = 0 ] && echo ok || echo "failed rc=$rc")" "$((SECONDS - started))"
}

# ----------------------------------------------------------------------------------------------- 2. check

device_check() {
    local started=$SECONDS limit rc
    limit="$(limit_for 90)"
    OUT="$OUT" timeout "$limit" "$PY" scripts/device_check.py >"$WORK/logs/device_check.log" 2>&1
    rc=$?
    local note=""
    [ "$DRY" = 1 ] && [ "$rc" != 0 ] && note="expected without a GPU"
    log "device_check: rc=$rc in $((SECONDS - started)) s ${note}"
    [ -f "$OUT/device_check.json" ] || cp "$WORK/logs/device_check.log" "$WORK/logs/device_check.txt"
    record_step check "$([ $rc = 0 ] && echo ok || echo "failed rc=$rc")" "$((SECONDS - started))" "$note"
}

# ----------------------------------------------------------------------------------------------- 3. llama

# Make the harness load the libraries in LIBDIR. Returns 0 when llama_cpp imports (with GPU offload unless
# dry), 3 when it imports but sees no GPU (a build would not help), another status when it cannot load.
try_libraries() {
    local libdir="$1" want="gpu" rc
    [ "$DRY" = 1 ] && want=""
    export PYTHONPATH="$SAVED_PYTHONPATH" LD_LIBRARY_PATH="$SAVED_LD_LIBRARY_PATH"
    benchcal_llama_env "$SITE" "$libdir" "$PY"
    # shellcheck disable=SC2016  # $1 and $2 belong to the inner shell
    timeout 120 bash -c 'source scripts/device_env.sh && benchcal_llama_check "$1" "$2"' _ "$PY" "$want" \
        >"$WORK/logs/llama_check.log" 2>&1
    rc=$?
    if [ "$rc" = 0 ]; then
        sed 's/^/    /' "$WORK/logs/llama_check.log" | tee -a "$LOG" >&2
        return 0
    fi
    if [ "$rc" = 3 ]; then
        log "llama_cpp loads $libdir but finds no GPU to offload to:"
    else
        log "llama_cpp did not load with $libdir (rc=$rc):"
    fi
    tail -n 5 "$WORK/logs/llama_check.log" | sed 's/^/    /' | tee -a "$LOG" >&2
    export PYTHONPATH="$SAVED_PYTHONPATH" LD_LIBRARY_PATH="$SAVED_LD_LIBRARY_PATH"
    unset LLAMA_CPP_LIB_PATH
    return "$rc"
}

setup_llama() {
    local started=$SECONDS libdir=""
    SAVED_PYTHONPATH="${PYTHONPATH:-}"
    SAVED_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
    if [ "$DRY" = 1 ]; then
        # The same path as on the GPU machine, with .venv's CPU libraries standing in for the CUDA build.
        SITE="$WORK/site"
        benchcal_prepare_site "$SITE" "$PY" >>"$WORK/logs/llama_setup.log" 2>&1 || log "could not prepare $SITE"
        local venv_lib
        venv_lib="$("$PY" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib"))')"
        if [ -z "${LLAMA_CUDA_TARBALL:-}" ]; then
            TARBALL="$WORK/llama-cpu.tar.zst"
            benchcal_pack_libs "$venv_lib" llama-cpu "$TARBALL" || log "could not pack $venv_lib"
        fi
    fi
    if [ ! -d "$SITE/llama_cpp" ] || [ ! -d "$SITE/gguf" ]; then
        log "no llama_cpp / gguf packages in $SITE (bash scripts/device_env.sh prepare makes them)"
        record_step llama "failed" "$((SECONDS - started))" "no site folder"
        return 1
    fi
    local rc=1
    if [ -f "$TARBALL" ]; then
        log "llama: unpacking $TARBALL"
        if libdir="$(benchcal_unpack_libs "$TARBALL" "$WORK/llama")"; then
            try_libraries "$libdir"
            rc=$?
        fi
        if [ "$rc" = 0 ]; then
            LLAMA_OK=1
            LLAMA_SOURCE="tarball $(basename "$TARBALL")"
        fi
    else
        log "llama: no prebuilt libraries at $TARBALL"
    fi
    if [ "$rc" = 3 ]; then
        log "llama: no GPU visible to the CUDA build: not building (see logs/llama_check.log)"
    elif [ "$LLAMA_OK" = 0 ] && [ "$DRY" != 1 ]; then
        build_llama
    fi
    [ -n "$libdir" ] && [ -f "$(dirname "$libdir")/BUILD_INFO.txt" ] \
        && sed 's/^/    build: /' "$(dirname "$libdir")/BUILD_INFO.txt" >>"$LOG"
    record_step llama "$([ "$LLAMA_OK" = 1 ] && echo ok || echo failed)" "$((SECONDS - started))" "$LLAMA_SOURCE"
    [ "$LLAMA_OK" = 1 ]
}

build_llama() {
    local started=$SECONDS limit jobs libdir
    # Leave about three minutes for measuring after the build.
    limit="$(limit_for $(( $(seconds_left) - 180 )))"
    if [ "$limit" -lt 120 ]; then
        log "llama: no time left to build llama.cpp (${limit} s)"
        return 1
    fi
    jobs="$(nproc 2>/dev/null || echo 8)"
    [ -f "$CARRY/llama-cpp-src.tar.zst" ] || log "llama: no $CARRY/llama-cpp-src.tar.zst: the build needs the network"
    log "llama: building llama.cpp with CUDA on this machine, -j$jobs, at most ${limit} s"
    if LLAMA_SRC_TARBALL="$CARRY/llama-cpp-src.tar.zst" PYTHON="$PY" timeout "$limit" \
        bash scripts/build_llama_cuda.sh -j "$jobs" --workdir "$WORK/build" "$WORK/built" \
        >"$WORK/logs/build_llama.log" 2>&1; then
        log "llama: built in $((SECONDS - started)) s"
        rm -rf "$WORK/build"  # the toolkit copy and objects: the disk is needed for checkpoints
        if libdir="$(benchcal_unpack_libs "$WORK/built/llama-cuda-sm90.tar.zst" "$WORK/llama")" \
            && try_libraries "$libdir"; then
            LLAMA_OK=1
            LLAMA_SOURCE="built here in $((SECONDS - started)) s"
        fi
    else
        log "llama: build failed or ran out of time after $((SECONDS - started)) s:"
        tail -n 8 "$WORK/logs/build_llama.log" | sed 's/^/    /' | tee -a "$LOG" >&2
    fi
    record_step build "$([ "$LLAMA_OK" = 1 ] && echo ok || echo failed)" "$((SECONDS - started))"
}

# ----------------------------------------------------------------------------------------------- 4. sweep

# The host and device microbenchmarks are cached for a day: run them now, in their own process, so the
# harness never opens a CUDA context of its own beside the engine's.
prewarm_profiles() {
    local limit
    limit="$(limit_for 90)"
    timeout "$limit" "$PY" - >>"$WORK/logs/profiles.log" 2>&1 <<'PY'
import json
from harness.hostbench import device_bandwidth_gbs, host_profile
from harness.samplers import gpu_snapshot
profile = {"host": host_profile()}
snapshot = gpu_snapshot(0)
if snapshot:
    profile["device_bandwidth_gbs"] = device_bandwidth_gbs(0, snapshot.get("device_uuid"))
print(json.dumps(profile))
PY
    tail -n 1 "$WORK/logs/profiles.log" | cut -c1-300 | tee -a "$LOG" >&2
}

# Split a sweep into one file per model (consecutive configs of one model) and estimate each:
# writes DIR/NN.toml and DIR/plan.tsv (file, model, quants, checkpoint bytes, first-config s, all s,
# configs still to measure, overrides). Configs already measured ok in RUNS are left out of the estimates.
plan_sweep() {
    local sweep="$1" dir="$2" device="$3" runs="${4:-}"
    rm -rf "$dir"
    mkdir -p "$dir"
    "$PY" - "$sweep" "$dir" "$device" "$runs" <<'PY'
import json, sys, tomllib
from pathlib import Path

from harness import records, synthetic
from harness.protocol import predict_config, prepare_config
from harness.sweep import expand, merge

sweep_path, out_dir, device, runs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
measured = records.ok_config_hashes(runs) if runs and Path(runs).is_dir() else set()
data = tomllib.loads(sweep_path.read_text())
defaults = data.get("defaults") or {}


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def estimate_s(config):
    """Seconds one config takes: start and load, then every timed pass at the predicted speeds, made
    slower on purpose (speeds capped, x1.5) so the budget is not overrun."""
    cfg = prepare_config({**config, "device": device})
    prediction, _ = predict_config(cfg)
    speeds = (prediction or {}).get("throughput") or {}
    decode = min(float(speeds.get("decode_tok_s") or 30.0), 400.0)
    prefill = min(float(speeds.get("prefill_tok_s") or 1000.0), 20000.0)
    file_type = synthetic.normalize_file_type(cfg.get("quant") or "Q4_K_M")
    weights = synthetic.weights_bytes(synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides")), file_type)
    prompts = cfg["prompt_tokens"] or [16]
    passes = int(cfg["warmup"]) + int(cfg["reps"])
    per_pass = sum(p / prefill + 0.02 for p in prompts) + min(prompts) / prefill + cfg["gen_tokens"] / decode
    return 15.0 + weights / 2.5e9 + 1.5 * passes * per_pass


groups = []
for entry in data.get("configs") or []:
    model = entry.get("model") or defaults.get("model")
    if groups and groups[-1]["model"] == model:
        groups[-1]["entries"].append(entry)
    else:
        groups.append({"model": model, "entries": [entry]})
rows = []
for number, group in enumerate(groups, 1):
    name = f"{number:02d}-{group['model']}.toml"
    lines = [f"name = {toml_value(str(data.get('name', sweep_path.stem)) + '-' + str(number))}"]
    if data.get("timeout_s"):
        lines.append(f"timeout_s = {toml_value(data['timeout_s'])}")
    lines.append("\n[defaults]")
    lines += [f"{k} = {toml_value(v)}" for k, v in defaults.items()]
    for entry in group["entries"]:
        lines.append("\n[[configs]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in entry.items()]
    (out_dir / name).write_text("\n".join(lines) + "\n")
    configs = [c for entry in group["entries"] for c in expand(merge(defaults, entry))
               if records.config_hash(prepare_config({**c, "device": device})) not in measured]
    files = {}
    for config in configs:
        cfg = prepare_config({**config, "device": device})
        file_type = synthetic.normalize_file_type(cfg.get("quant") or "Q4_K_M")
        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        overrides = json.dumps(cfg.get("arch_overrides") or {}, sort_keys=True)
        files[(file_type, overrides)] = synthetic.weights_bytes(spec, file_type)
    estimates = [estimate_s(c) for c in configs] or [0.0]
    quants = ",".join(sorted({q for q, _ in files})) or "-"  # never an empty field: read would drop it
    overrides = next(iter(files))[1] if files else "{}"
    rows.append([name, group["model"], quants, str(sum(files.values())), f"{estimates[0]:.0f}",
                 f"{sum(estimates):.0f}", str(len(configs)), overrides])
(out_dir / "plan.tsv").write_text("".join("\t".join(row) + "\n" for row in rows))
for row in rows:
    print(f"  {row[0]:<28} {row[2]:<14} {int(row[3]) / 2**30:7.2f} GiB  first {row[4]:>4} s  all {row[5]:>4} s"
          f"  ({row[6]} configs)")
PY
}

# Write the checkpoints a group needs (the harness's synthetic writer), timed; appends to $GEN.
generate_checkpoints() {
    local model="$1" quants="$2" overrides="$3" limit="$4"
    timeout "$limit" "$PY" - "$model" "$quants" "$overrides" >>"$GEN" 2>>"$WORK/logs/generation.log" <<'PY'
import json, os, sys, time
from harness import synthetic

model, quants, overrides = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3]) or None
for quant in quants:
    started = time.perf_counter()
    path = synthetic.synthetic_gguf(model, quant, overrides)
    print(f"{model}\t{quant}\t{os.path.getsize(path)}\t{time.perf_counter() - started:.2f}", flush=True)
PY
}

pack_results() {
    tar -czf "$OUT/runs.tar.gz.partial" -C "$RUNS" . 2>/dev/null && mv "$OUT/runs.tar.gz.partial" "$OUT/runs.tar.gz"
}

run_sweep() {
    local started=$SECONDS device_id="cpu"
    prewarm_profiles
    if [ "$DRY" != 1 ]; then
        device_id="$("$PY" -c 'from benchcal.commands.bench import resolve_bench_device as r; print(r("auto"))' 2>/dev/null || echo h200-sxm)"
    fi
    if [ -n "${DEVICE_RESUME_RUNS:-}" ] && [ -f "$DEVICE_RESUME_RUNS" ]; then
        tar -xzf "$DEVICE_RESUME_RUNS" -C "$RUNS" && log "sweep: resuming over the records in $DEVICE_RESUME_RUNS"
    fi
    log "sweep: $SWEEP on $device_id, split by model:"
    plan_sweep "$SWEEP" "$WORK/plan/sweep" "$device_id" "$RUNS" 2>>"$WORK/logs/plan.log" | tee -a "$LOG" >&2
    [ -s "$WORK/plan/sweep/plan.tsv" ] || { log "sweep: planning failed"; record_step sweep failed 0 "plan"; return 1; }
    local file model quants bytes first_s all_s count overrides
    while IFS=$'\t' read -r file model quants bytes first_s all_s count overrides; do
        local group_started=$SECONDS left gen_s need free
        if [ "$count" = 0 ]; then
            log "sweep: $model: every config already measured"
            continue
        fi
        left="$(seconds_left)"
        gen_s=$(( bytes / (GEN_MBS * 1000000) + 1 ))
        need=$(( gen_s + first_s ))
        free="$(df -B1 --output=avail "$BENCHCAL_CACHE" | tail -n 1 | tr -d ' ')"
        if [ "$need" -gt "$left" ]; then
            log "sweep: skip $model: needs about ${need} s (checkpoints ${gen_s} s + first config ${first_s} s), ${left} s left"
            record_step "sweep:$model" skipped 0 "needs ${need} s, ${left} s left"
            continue
        fi
        if [ "$free" -lt $(( bytes + DISK_MARGIN_BYTES )) ]; then
            log "sweep: skip $model: checkpoints need $((bytes >> 30)) GiB, $((free >> 30)) GiB free"
            record_step "sweep:$model" skipped 0 "disk"
            continue
        fi
        log "sweep: $model ($quants, $((bytes >> 20)) MiB of checkpoints, $count configs, estimated ${gen_s}+${all_s} s)"
        local gen_started=$SECONDS
        if ! generate_checkpoints "$model" "$quants" "$overrides" "$(limit_for $(( left - first_s )))"; then
            log "sweep: writing the $model checkpoints failed or ran out of time"
            rm -rf "$BENCHCAL_CACHE/synthetic"
            record_step "sweep:$model" failed "$((SECONDS - group_started))" "checkpoints"
            continue
        fi
        local gen_took=$(( SECONDS - gen_started ))
        if [ "$gen_took" -gt 0 ] && [ "$bytes" -gt $((256 * 1024 * 1024)) ]; then
            GEN_MBS=$(( bytes / gen_took / 1000000 ))
            [ "$GEN_MBS" -gt 0 ] || GEN_MBS=1
        fi
        log "sweep: checkpoints written in ${gen_took} s (${GEN_MBS} MB/s assumed from now on)"
        local bench_limit rc
        bench_limit="$(limit_for 100000)"
        timeout -s TERM -k 20 "$bench_limit" "$PY" -m benchcal bench --sweep "$WORK/plan/sweep/$file" \
            --runs-dir "$RUNS" --gpu "$GPU_FLAG" </dev/null >"$WORK/logs/bench-${file%.toml}.log" 2>&1
        rc=$?
        grep -E "sweep |interrupted|error" "$WORK/logs/bench-${file%.toml}.log" | head -n 5 | sed 's/^/    /' | tee -a "$LOG" >&2
        rm -rf "$BENCHCAL_CACHE/synthetic"
        pack_results
        log "sweep: $model done, rc=$rc, in $((SECONDS - group_started)) s"
        record_step "sweep:$model" "$([ $rc = 0 ] && echo ok || echo "rc=$rc")" "$((SECONDS - group_started))"
    done <"$WORK/plan/sweep/plan.tsv"
    record_step sweep "done" "$((SECONDS - started))"
}

# --------------------------------------------------------------------------------------------- 5. fallback

run_fallback() {
    local started=$SECONDS
    if ! "$PY" -c 'from harness.engines.base import ENGINE_CLASSES as e; raise SystemExit(0 if "transformers" in e else 1)'; then
        log "fallback: the transformers engine is not registered in harness.engines.base.ENGINE_CLASSES"
        record_step fallback failed 0 "engine not registered"
        return 1
    fi
    local model args
    for model in $FALLBACK_MODELS; do
        local left
        left="$(seconds_left)"
        if [ "$left" -lt 60 ]; then
            log "fallback: no time left for $model"
            break
        fi
        if [ "$DRY" = 1 ]; then
            args=(--quant F32 --kv-dtype f32 --ctx 256 --prompt "16,32" --gen 4 --reps 2 --warmup 1
                  --override num_layers=2 --override vocab_size=2048)
        else
            args=(--quant BF16 --kv-dtype bf16 --ctx 32768 --prompt "512,4096" --gen 64 --reps 5 --warmup 1)
        fi
        log "fallback: transformers $model"
        timeout -s TERM -k 20 "$left" "$PY" -m benchcal bench --engine transformers --gpu "$GPU_FLAG" \
            --model "$model" "${args[@]}" --runs-dir "$RUNS" >"$WORK/logs/fallback-$model.log" 2>&1
        log "fallback: $model rc=$?"
        pack_results
    done
    record_step fallback "done" "$((SECONDS - started))"
}

# ------------------------------------------------------------------------------------------------- 6. pack

dry_sweep() {
    # Two tiny models (two layers, 2048-token vocabularies), the same structure as the GPU sweep.
    cat >"$WORK/dry-sweep.toml" <<'TOML'
name = "dry-run"
timeout_s = 120

[defaults]
engine = "llama.cpp"
device = "auto"
weights = "synthetic"
context = 512
prompt_tokens = [16, 64]
gen_tokens = 8
reps = 2
warmup = 1
engine_options = { n_gpu_layers = -1, flash_attn = true, threads = 2 }
arch_overrides = { num_layers = 2, vocab_size = 2048 }

[[configs]]
model = "qwen2.5-0.5b"
quant = ["Q4_K_M", "F16"]

[[configs]]
model = "smollm2-135m"
quant = "Q8_0"
context = 256
prompt_tokens = [16]
TOML
    SWEEP="${DEVICE_SWEEP:-$WORK/dry-sweep.toml}"
}

write_summary() {
    "$PY" - "$OUT/summary.json" "$STEPS" "$GEN" "$RUNS" "$LLAMA_SOURCE" "$((SECONDS - T0))" "$BUDGET_S" "$DRY" <<'PY' \
        >>"$WORK/logs/summary.log" 2>&1
import json, sys
from pathlib import Path

out, steps, gen, runs, llama_source, elapsed, budget, dry = sys.argv[1:9]
summary = {"dry_run": dry == "1", "elapsed_s": int(elapsed), "budget_s": int(budget), "llama": llama_source,
           "steps": [], "checkpoints": [], "records": {}}
for line in Path(steps).read_text().splitlines():
    name, status, seconds, note = (line.split("\t") + [""] * 4)[:4]
    summary["steps"].append({"step": name, "status": status, "seconds": int(seconds or 0), "note": note})
for line in Path(gen).read_text().splitlines():
    model, quant, size, seconds = line.split("\t")
    summary["checkpoints"].append({"model": model, "quant": quant, "bytes": int(size), "seconds": float(seconds),
                                   "mb_per_s": round(int(size) / max(float(seconds), 1e-9) / 1e6, 1)})
for path in sorted(Path(runs).rglob("*.json")):
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        continue
    config = record.get("config") or {}
    decode = ((record.get("measurements") or {}).get("decode") or {}).get("decode_tok_s") or {}
    prefill = [{"prompt_tokens": p.get("prompt_tokens"), "ttft_ms": (p.get("ttft_ms") or {}).get("median")}
               for p in (record.get("measurements") or {}).get("prefill") or []]
    summary["records"][str(path.relative_to(runs))] = {
        "status": record.get("status"), "reason": record.get("reason"), "model": config.get("model"),
        "quant": config.get("quant"), "engine": config.get("engine"), "device": config.get("device"),
        "context": config.get("context"), "decode_tok_s": decode.get("median"), "prefill": prefill,
        "peak_bytes": (record.get("memory") or {}).get("peak_bytes")}
Path(out).write_text(json.dumps(summary, indent=1))
counts = {}
for item in summary["records"].values():
    counts[item["status"]] = counts.get(item["status"], 0) + 1
print(json.dumps(counts))
PY
}

finish() {
    trap - EXIT INT TERM
    pack_results
    write_summary
    local records
    records="$(find "$RUNS" -name '*.json' | wc -l)"
    log "records: $records ($(tail -n 1 "$WORK/logs/summary.log" 2>/dev/null))"
    # Logs: the script's own, the engines' (referenced by each record's provenance.log_file), the plan.
    mkdir -p "$WORK/logs/engine"
    cp "$BENCHCAL_CACHE"/logs/*.log "$WORK/logs/engine/" 2>/dev/null
    cp -r "$WORK/plan" "$STEPS" "$GEN" "$WORK/logs/" 2>/dev/null
    tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
    log "done in $((SECONDS - T0)) s of ${BUDGET_S} s; results in $OUT: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
    grep -q '"ok"' "$WORK/logs/summary.log" 2>/dev/null && exit 0
    exit 1
}

main() {
    trap finish EXIT
    trap 'log "stopped by a signal"; exit 130' INT TERM
    log "device_calibrate: budget ${BUDGET_S} s, python $("$PY" -c 'import sys; print(sys.version.split()[0])'), dry run ${DRY}, work $WORK"
    [ "$DRY" = 1 ] && dry_sweep
    gpu_facts
    device_check
    if setup_llama; then
        run_sweep
    fi
    if [ "$DRY" = 1 ]; then
        log "dry run: planning the GPU sweep (not run) on h200-sxm"
        plan_sweep "$REPO_ROOT/harness/sweeps/h200-calibration.toml" "$WORK/plan/h200" h200-sxm \
            2>>"$WORK/logs/plan.log" | tee -a "$LOG" >&2
    fi
    if [ "$LLAMA_OK" = 0 ] || [ "${DEVICE_FORCE_FALLBACK:-0}" = 1 ]; then
        run_fallback
    fi
}

main
