"""Measured against predicted, one row per run: the table ``bench`` prints after measuring."""

from __future__ import annotations

from typing import Any

from harness import record_tables

GIB = float(2**30)


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: '-' for a missing figure, thousands separators for a float."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render_comparison(stored: list[dict[str, Any]], paths: list[str]) -> str:
    """Measured vs predicted, one row per run, as a plain-text table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="measured vs predicted", show_lines=False)
    for title in ("model", "quant", "ctx", "status", "TTFT ms", "prefill tok/s", "decode tok/s", "peak GiB",
                  "verdict"):
        table.add_column(title, justify="right" if title not in ("model", "status", "verdict") else "left")
    for record, path in zip(stored, paths, strict=True):
        row = record_tables.run_row(path, record)
        memory_gib = row["peak_memory_bytes"] / GIB if row["peak_memory_bytes"] else None
        table.add_row(
            str(row["model"]), str(row["quant"]), str(row["context"]),
            row["status"] + ("" if not row["prediction_error"] else " (prediction error)"),
            f"{fmt(row['ttft_ms'])} / {fmt(row['pred_ttft_ms'])}",
            f"{fmt(row['prefill_tok_s'], 0)} / {fmt(row['pred_prefill_tok_s'], 0)}",
            f"{fmt(row['decode_tok_s'])} / {fmt(row['pred_decode_tok_s'])}",
            f"{fmt(memory_gib, 2)} / {fmt(row['pred_memory_total_gib'], 2)}",
            str(row["pred_verdict"] or "-"),
        )
    console = Console(record=True, width=140, file=NullFile())
    console.print(table)
    console.print("measured / predicted; peak memory: " + ", ".join(
        sorted({str(r['memory'].get('peak_source')) for r in stored})))
    return console.export_text()


def render_serving(stored: list[dict[str, Any]]) -> str:
    """Serving runs, one row per load level: throughput and latency percentiles as measured."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="serving under load (measured)", show_lines=False)
    for title in ("model", "engine", "load", "done", "req/s", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 ms",
                  "ITL p99 ms", "errors"):
        table.add_column(title, justify="left" if title in ("model", "engine", "load") else "right")
    for record in stored:
        config = record["config"]
        levels = (record.get("measurements") or {}).get("serving", {}).get("levels") or []
        if not levels:
            table.add_row(str(config["model"]), str(config["engine"]), "-", "-", "-", "-", "-", "-", "-",
                          f"{record['status']}: {(record.get('reason') or '')[:60]}")
        for level in levels:
            load = (f"concurrency {level['concurrency']}" if level.get("concurrency") is not None
                    else f"{level['request_rate']:g} req/s")
            table.add_row(
                str(config["model"]), str(config["engine"]), load, f"{level['completed']}/{level['requests']}",
                fmt(level["request_throughput"], 2), fmt(level["output_tok_s"]),
                f"{fmt(level['ttft_ms']['p50'], 0)} / {fmt(level['ttft_ms']['p99'], 0)}",
                fmt(level["tpot_ms"]["p50"]), fmt(level["itl_ms"]["p99"]),
                str(level["errors"] + level["timeouts"]))
    console = Console(record=True, width=140, file=NullFile())
    console.print(table)
    return console.export_text()


class NullFile:
    """A file that discards what is written (rich renders into its record instead)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None
