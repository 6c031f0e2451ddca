"""``benchcal bench`` with no model and no sweep: calibrate this machine if no run describes it, else check it.

- A device no coefficient table describes (this CPU host, by its id ``cpu-<model>-<isa>-<cores>c``, or this GPU)
  is calibrated: the host calibration sweep (``harness/sweeps/host-calibration.toml`` on a CPU,
  ``harness/sweeps/gpu-calibration.toml`` on a GPU) is measured into the user's runs, the user's runs are fitted
  starting from the shipped table (``benchcal calibrate``'s fit, written to ``$BENCHCAL_HOME/calibration``), and
  the measurements are shown next to what the shipped table predicted before (prior) and what the fitted one
  predicts now, with a prediction for configurations it did not measure and the fit's error band.
- A device that is calibrated (by the user's own fit or the shipped table) measures the smoke sweep
  (``harness/sweeps/cpu-smoke.toml`` on a CPU) against its calibrated predictions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from harness import records
from predictor.errors import BenchcalError

HOST_SWEEP = {"cpu": "host-calibration", "gpu": "gpu-calibration"}
SMOKE_SWEEP = {"cpu": "cpu-smoke", "gpu": "gpu-calibration"}
# Configurations the host sweep does not measure, predicted after the fit (another architecture and size,
# a format the sweep fits only on other shapes).
UNMEASURED = {
    "cpu": [{"model": "smollm2-360m", "quant": "Q4_K_M", "context": 2048, "prompt_tokens": [64, 256]},
            {"model": "llama-3.2-1b", "quant": "Q8_0", "context": 4096, "prompt_tokens": [64, 512]}],
    "gpu": [{"model": "qwen2.5-7b", "quant": "Q4_K_M", "context": 8192, "prompt_tokens": [512, 2048]}],
}


def device_identity(device: str, host: Mapping[str, Any] | None) -> str:
    """The id a coefficient table knows this device by: the host id on a CPU, the catalogue id on a GPU."""
    return str((host or {}).get("host_id") or "cpu") if device == "cpu" else device


def run_default(args: argparse.Namespace, root: Path, device: str,
                measure: Callable[[list[dict[str, Any]], float | None], list[Any]]) -> int:
    """Calibrate this device if nothing describes it, else measure the smoke sweep; returns the exit code.

    ``measure(configs, timeout)`` runs configs through the harness and returns their outcomes."""
    from harness.protocol import prepare_config
    from harness.sweep import load_sweep, pending
    from predictor.coefficients import default_coefficients

    if (args.engine or "llama.cpp").strip().lower() != "llama.cpp":
        raise BenchcalError("bench without --model calibrates this machine for llama.cpp; for vLLM measure a sweep "
                            "(benchcal bench --engine vllm --sweep cpu-vllm-calibration) and run benchcal calibrate")
    host = _host(device)
    device_id = device_identity(device, host)
    kind = "cpu" if device == "cpu" else "gpu"
    engine = (args.engine or "llama.cpp").strip().lower()
    table = default_coefficients()
    if table.has_device(engine, device_id):
        sweep = load_sweep(SMOKE_SWEEP[kind])
        _say(f"{device_id} is calibrated ({table.lookup(engine, device_id, chr(0)).source}); measuring the "
             f"{sweep.name} sweep against its predictions")
        configs = [prepare_config(_on(c, device, args)) for c in sweep.configs]
        outcomes = measure(configs, args.timeout or sweep.timeout_s)
        from benchcal.commands.comparison import render_comparison

        print(render_comparison([o.record for o in outcomes], [str(o.path) for o in outcomes]))
        return 0 if all(o.record["status"] == "ok" for o in outcomes) else 1

    sweep = load_sweep(HOST_SWEEP[kind])
    _say(f"{device_id}: uncalibrated on this host; measuring the {sweep.name} sweep ({sweep.path}), then fitting "
         f"it; runs go to {root}")
    configs = [prepare_config(_on(c, device, args)) for c in sweep.configs]
    todo, skipped = pending(configs, root, (host or {}).get("host_id"))
    _say(f"sweep {sweep.name}: {len(todo)} to run, {len(skipped)} already measured")
    measure(todo, args.timeout or sweep.timeout_s)
    mine = _host_records(root, device_id, engine, configs)
    if not any(r["status"] == "ok" for r, _ in mine):
        _say("no run of the sweep succeeded; nothing to fit")
        return 1
    out = fit_user_runs([str(root)])
    calibrated = [_predict(record["config"], host) for record, _ in mine]
    print(render_calibration(mine, calibrated))
    print(render_unmeasured(kind, device, host, out))
    return 0 if all(r["status"] == "ok" for r, _ in mine) else 1


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _host(device: str) -> dict[str, Any] | None:
    if device != "cpu":
        return None
    from harness.hostbench import host_profile

    return host_profile()


def _on(config: Mapping[str, Any], device: str, args: argparse.Namespace) -> dict[str, Any]:
    out = dict(config)
    if str(out.get("device", "auto")).lower() in ("auto", "cpu"):
        out["device"] = device
    if getattr(args, "threads", None):
        out["engine_options"] = {**(out.get("engine_options") or {}), "threads": args.threads}
    return out


def _host_records(root: Path, device_id: str, engine: str,
                  configs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Path]]:
    """The newest stored record of each sweep config on this device."""
    wanted = {records.config_hash(c) for c in configs}
    newest: dict[str, tuple[dict[str, Any], Path]] = {}
    for run in records.iter_records(root, on_error=lambda path, message: None):
        record = run.record
        config, prov = record.get("config") or {}, record.get("provenance") or {}
        on_device = prov.get("host_id") == device_id if config.get("device") == "cpu" else config.get("device") == device_id
        if record.get("config_hash") not in wanted or not on_device or config.get("engine") != engine:
            continue
        key = record["config_hash"]
        if key not in newest or str(record["id"]) > str(newest[key][0]["id"]):
            newest[key] = (record, run.path)
    return sorted(newest.values(), key=lambda item: str(item[0]["id"]))


def fit_user_runs(dirs: list[str], out: str | None = None, n_boot: int = 30) -> Path:
    """``benchcal calibrate`` of the user's runs with the shipped table as prior; returns the output folder."""
    from calibration.crossval import annotate, cross_validate
    from calibration.dataset import load_dataset
    from calibration.output import write_table
    from calibration.table import fit_table
    from predictor.coefficients import default_coefficients_path, load_coefficients
    from predictor.userdata import user_calibration_dir

    dataset = load_dataset(dirs)
    prior = load_coefficients(default_coefficients_path())
    folder = Path(out) if out else user_calibration_dir()
    source = f"benchcal calibrate --runs-dir {' '.join(dirs)} (prior: {prior.source})"
    table = fit_table(dataset, n_boot=n_boot, source=source, prior=prior)
    table = annotate(table, dataset, cross_validate(dataset, table, prior))
    for path in write_table(table, folder, dirs):
        _say(f"wrote {path}")
    return folder


def _predict(config: Mapping[str, Any], host: Mapping[str, Any] | None) -> dict[str, Any] | None:
    from harness.protocol import predict_config

    prediction, _reason = predict_config(config, host)
    return prediction


def _median(summary: Any) -> float | None:
    return summary.get("median") if isinstance(summary, dict) else None


def _measured(record: Mapping[str, Any]) -> dict[str, float | None]:
    measurements = record.get("measurements") or {}
    prefill = [p for p in measurements.get("prefill") or [] if isinstance(p, dict)]
    largest = max(prefill, key=lambda p: p.get("prompt_tokens") or 0) if prefill else {}
    peak = (record.get("memory") or {}).get("peak_bytes")
    return {"decode": _median((measurements.get("decode") or {}).get("decode_tok_s")),
            "prefill": _median(largest.get("prefill_tok_s")), "ttft": _median(largest.get("ttft_ms")),
            "memory": peak / 2**30 if isinstance(peak, (int, float)) else None}


def _predicted(prediction: Mapping[str, Any] | None) -> dict[str, float | None]:
    from harness.record_tables import prediction_columns

    cols = prediction_columns(prediction or {})
    return {"decode": cols["pred_decode_tok_s"], "prefill": cols["pred_prefill_tok_s"], "ttft": cols["pred_ttft_ms"],
            "memory": cols["pred_memory_total_gib"]}


def _cell(measured: float | None, *predicted: float | None, digits: int = 1) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:,.{digits}f}"

    def err(x: float | None) -> str:
        return "" if x is None or not measured else f" ({100 * (x / measured - 1):+.0f}%)"

    return " / ".join([fmt(measured)] + [fmt(p) + err(p) for p in predicted])


def relative_errors(mine: list[tuple[dict[str, Any], Path]],
                    calibrated: list[dict[str, Any] | None]) -> dict[str, dict[str, list[float]]]:
    """``{"prior"|"calibrated": {quantity: [|predicted / measured - 1|, ...]}}`` over the ok runs."""
    out: dict[str, dict[str, list[float]]] = {"prior": {}, "calibrated": {}}
    for (record, _path), after in zip(mine, calibrated, strict=True):
        if record["status"] != "ok":
            continue
        measured = _measured(record)
        for name, prediction in (("prior", record.get("prediction")), ("calibrated", after)):
            for q, value in _predicted(prediction).items():
                if value and measured[q]:
                    out[name].setdefault(q, []).append(abs(value / measured[q] - 1))
    return out


def render_calibration(mine: list[tuple[dict[str, Any], Path]], calibrated: list[dict[str, Any] | None]) -> str:
    """Measured / prior / calibrated per run of the host sweep, and the MAPE of each column."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="host calibration: measured / prior (shipped table) / calibrated (this host's fit)")
    for title in ("model", "quant", "ctx", "fa", "status", "decode tok/s", "prefill tok/s", "peak GiB"):
        table.add_column(title, justify="left" if title in ("model", "status") else "right")
    for (record, _path), after in zip(mine, calibrated, strict=True):
        config = record["config"]
        measured, prior, fitted = _measured(record), _predicted(record.get("prediction")), _predicted(after)
        overrides = config.get("arch_overrides") or {}
        label = str(config["model"]) + "".join(f" {k.replace('num_', '')}={v}" for k, v in sorted(overrides.items()))
        table.add_row(
            label, str(config.get("quant")), str(config["context"]),
            "on" if (config.get("engine_options") or {}).get("flash_attn") else "off", str(record["status"]),
            _cell(measured["decode"], prior["decode"], fitted["decode"]),
            _cell(measured["prefill"], prior["prefill"], fitted["prefill"], digits=0),
            _cell(measured["memory"], prior["memory"], fitted["memory"], digits=2),
        )
    errors = relative_errors(mine, calibrated)
    lines = []
    for name in ("prior", "calibrated"):
        parts = [f"{q} {100 * sum(v) / len(v):.1f}%" for q, v in errors[name].items() if v]
        lines.append(f"MAPE {name}: " + ("; ".join(parts) or "-"))
    console = Console(record=True, width=165, file=_Null())
    console.print(table)
    for line in lines:
        console.print(line)
    return console.export_text()


def render_unmeasured(kind: str, device: str, host: Mapping[str, Any] | None, folder: Path) -> str:
    """Predictions for configurations the sweep did not measure, with the fitted scope's error band."""
    from harness.protocol import prepare_config

    lines = [f"fitted table: {folder / 'coefficients.json'} (predict and bench use it for this device)",
             "predicted for configurations not measured here (error band: p90 of the fit's leave-one-model-out "
             "errors on this device):"]
    for spec in UNMEASURED[kind]:
        config = prepare_config({"engine": "llama.cpp", "device": device, "weights": "synthetic", "gen_tokens": 32,
                                 **spec})
        prediction = _predict(config, host) or {}
        thr, cal = prediction.get("throughput") or {}, prediction.get("calibration") or {}
        band = cal.get("error_band") or {}
        lines.append(f"  {spec['model']} {spec['quant']} ctx {spec['context']}: "
                     f"{_with_band(thr.get('decode_tok_s'), 'decode', 'tok/s', band)}, "
                     f"{_with_band(thr.get('prefill_tok_s'), 'prefill', 'tok/s', band, 0)} "
                     f"({thr.get('prompt_tokens')}-token prompt); scope {cal.get('scope')}")
    lines.append("measure one with: benchcal bench --gpu " + ("cpu" if device == "cpu" else device) +
                 f" --model {UNMEASURED[kind][0]['model']} --quant {UNMEASURED[kind][0]['quant']} "
                 f"--ctx {UNMEASURED[kind][0]['context']}")
    return "\n".join(lines)


def _with_band(value: float | None, q: str, unit: str, band: Mapping[str, float], digits: int = 1) -> str:
    if value is None:
        return f"{q} -"
    spread = f" ±{100 * band[q]:.0f}%" if q in band else " (no error band)"
    return f"{q} {value:,.{digits}f} {unit}{spread}"


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None
