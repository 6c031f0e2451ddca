"""Write a fitted coefficient table: ``coefficients.json`` (what ``predict --coefficients`` reads),
``coefficients.csv`` (one row per scope and coefficient) and ``coefficients.md`` (for people).

The JSON follows ``predictor.coefficients``: ``engines -> default / families / devices -> NAME ->
{value, uncertainty, ...}`` plus ``error_band`` per scope; ``cross_validation`` holds the summary metrics.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from predictor.coefficients import COEFFICIENT_NAMES, ENGINE_DEFAULTS
from predictor.registry import REGISTRY

CSV_COLUMNS = ("engine", "scope", "name", "coefficient", "value", "uncertainty", "identified", "quantity", "n_runs",
               "n_points", "devices", "models", "engine_versions", "cv", "cv_mape", "note")


def scopes(table: dict[str, Any]):
    """Yield (engine, scope kind, scope name, entry) for every scope of the table."""
    for engine, eng in (table.get("engines") or {}).items():
        if eng.get("default"):
            yield engine, "engine", "default", eng["default"]
        for kind, key in (("family", "families"), ("device", "devices")):
            for name, entry in sorted((eng.get(key) or {}).items()):
                yield engine, kind, name, entry


def coefficient_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per (scope, coefficient)."""
    rows = []
    for engine, kind, name, entry in scopes(table):
        for coeff in COEFFICIENT_NAMES:
            item = entry.get(coeff)
            if not isinstance(item, dict):
                continue
            rows.append({
                "engine": engine, "scope": kind, "name": name, "coefficient": coeff,
                "value": item.get("value"), "uncertainty": item.get("uncertainty"),
                "identified": item.get("identified"), "quantity": item.get("quantity"),
                "n_runs": item.get("n_runs"), "n_points": item.get("n_points"),
                "devices": ";".join(item.get("devices") or []), "models": ";".join(item.get("models") or []),
                "engine_versions": ";".join(item.get("engine_versions") or []),
                "cv": item.get("cv"), "cv_mape": item.get("cv_mape"), "note": item.get("note", ""),
            })
    return rows


def to_csv(table: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(coefficient_rows(table))
    return buf.getvalue()


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}%"


def _num(x: Any) -> str:
    if x is None:
        return "—"
    x = float(x)
    return f"{x:.4g}"


def _metrics_table(metrics: dict[str, Any]) -> list[str]:
    lines = ["| validation | decode MAPE / p90 | prefill MAPE / p90 | TTFT MAPE / p90 | memory MAPE / p90 |",
             "|---|---|---|---|---|"]
    labels = {"in_sample": "in-sample", "lomo": "leave one model out", "lodo": "leave one device out",
              "lofo": "leave one family out", "loso": "leave one source out"}
    for key in ("in_sample", "lomo", "lodo", "lofo", "loso"):
        block = metrics.get(key) or {}
        groups = [("all runs", block.get("overall") or {})]
        kinds = block.get("kinds") or {}
        if len(kinds) > 1:
            groups += [(f"{kind} devices", kinds[kind]) for kind in sorted(kinds)]
        imported = (block.get("origins") or {}).get("imported") or {}
        if any((imported.get(q) or {}).get("n") for q in ("decode", "prefill")):
            groups.append(("imported public results", imported))
        for label, by_q in groups:
            cells = []
            for q in ("decode", "prefill", "ttft", "memory"):
                m = by_q.get(q) or {}
                cells.append(f"{_pct(m.get('mape'))} / {_pct(m.get('p90'))} (n={m.get('n', 0)})" if m.get("n") else "—")
            lines.append(f"| {labels[key]}, {label} | " + " | ".join(cells) + " |")
    return lines


def _era_section(table: dict[str, Any]) -> list[str]:
    """Build eras (``predictor/data/engine_eras.json``): each era and device kind compared, and the era values kept."""
    out: list[str] = []
    for engine, eng in (table.get("engines") or {}).items():
        checks = eng.get("era_checks") or []
        if not checks:
            continue
        out += ["", f"## {engine} — build eras", "",
                "Per era and device kind, the era terms (`era_terms` in `predictor/data/engine_eras.json`) refitted "
                "on that era's runs with every other coefficient at the value a device nobody measured gets (its "
                "family, else the engine scope), and the error of that fallback on the era's runs without and with "
                "them (in-sample: judged on the runs the era values were fitted on). Kept (used by "
                "`predict --engine-build` and by default for the newest era) only where they "
                "bring the runs closer: where the runs show a difference.", "",
                "| kind | era | quantity | devices | fallback MAPE | with era values | kept |", "|---|---|---|---|---|---|---|"]
        for c in checks:
            out.append(f"| {c['kind']} | {c['era']} | {c['quantity']} | {', '.join(c.get('devices') or [])} "
                       f"| {_pct(c['fallback_mape'])} | {_pct(c['era_mape'])} | {'yes' if c['kept'] else 'no'} |")
        for era, item in (eng.get("eras") or {}).items():
            for kind, values in (item.get("kinds") or {}).items():
                shown = ", ".join(f"{k} = {_num(v['value'])}" for k, v in values.items()
                                  if isinstance(v, dict) and "value" in v)
                out.append(f"- era {era} ({item.get('label', '')}), {kind}: {shown}")
    return out


def to_markdown(table: dict[str, Any], runs_dirs: list[str] | None = None) -> str:
    """The table for people: validation summary, then each scope's coefficients with their provenance."""
    out = ["# benchcal coefficient table", "",
           f"Fitted by `{table.get('source', 'benchcal calibrate')}` at {table.get('created_at', '?')}"
           + (f" from {', '.join(runs_dirs)}" if runs_dirs else "") + ".",
           "Values replace the engine defaults in `predictor/coefficients.py` per device where it was measured, "
           "else per device family (memory type / architecture), else per engine. Uncertainty is 1 sigma from a "
           "bootstrap over runs; `cv MAPE` is the cross-validated error of the quantity the coefficient "
           "predicts (LOMO for a device, LODO for a family or engine scope). Coefficients marked *held* could not "
           "be identified from the scope's runs and carry the parent scope's value.", "",
           "## Validation", ""]
    out += _metrics_table(table.get("cross_validation") or {})
    for engine, kind, name, entry in scopes(table):
        band = entry.get("error_band") or {}
        out += ["", f"## {engine} — {kind} `{name}`", ""]
        if band:
            out.append("Error band (p90): " + ", ".join(f"{q} ±{_pct(v)}" for q, v in band.items()) + ".")
            out.append("")
        figures = entry.get("host_figures") or {}
        if figures:
            out.append(f"Host probe figures its runs were measured with (median of {figures.get('n_runs')} runs; "
                       f"predictions for this host use them): bandwidth {_num(figures.get('bandwidth_gbs'))} GB/s, "
                       f"matmul {_num(figures.get('matmul_gflops'))} GFLOP/s.")
            out.append("")
        out += ["| coefficient | value | ± | unit | fitted | runs | points | devices | models | engine versions "
                "| cv MAPE |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for coeff in COEFFICIENT_NAMES:
            item = entry.get(coeff)
            if not isinstance(item, dict):
                continue
            devices = item.get("devices") or []
            shown_devices = ", ".join(devices[:4]) + (f" +{len(devices) - 4}" if len(devices) > 4 else "")
            versions = item.get("engine_versions") or []
            shown_versions = ", ".join(versions) if len(versions) <= 2 else (
                f"{len(versions)} versions: {versions[0]} … {versions[-1]}")
            out.append(
                f"| {coeff} | {_num(item.get('value'))} | {_num(item.get('uncertainty'))} | {REGISTRY[coeff].unit} "
                f"| {'yes' if item.get('identified') else 'held'} | {item.get('n_runs', '—')} "
                f"| {item.get('n_points', '—')} | {shown_devices} | {', '.join(item.get('models') or [])} "
                f"| {shown_versions} | {_pct(item.get('cv_mape'))} |")
        notes = [(coeff, entry[coeff]["note"]) for coeff in COEFFICIENT_NAMES
                 if isinstance(entry.get(coeff), dict) and entry[coeff].get("note")]
        if notes:
            out.append("")
            out += [f"- `{coeff}`: {note}" for coeff, note in notes]
    out += _era_section(table)
    out += ["", "## Engine defaults (used where nothing was fitted)", "",
            "| engine | coefficient | value | source |", "|---|---|---|---|"]
    for engine, defaults in ENGINE_DEFAULTS.items():
        for coeff, (value, source) in defaults.items():
            out.append(f"| {engine} | {coeff} | {value:g} | {source} |")
    return "\n".join(out) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_table(table: dict[str, Any], out_dir: str | os.PathLike[str],
                runs_dirs: list[str] | None = None) -> list[Path]:
    """Write coefficients.json, .csv and .md into ``out_dir``; returns the paths."""
    folder = Path(out_dir)
    paths = [folder / "coefficients.json", folder / "coefficients.csv", folder / "coefficients.md"]
    _atomic_write(paths[0], json.dumps(table, indent=1, sort_keys=False, allow_nan=False) + "\n")
    _atomic_write(paths[1], to_csv(table))
    _atomic_write(paths[2], to_markdown(table, runs_dirs))
    return paths
