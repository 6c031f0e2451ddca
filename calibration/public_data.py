"""Import the public benchmark results kept under ``tests/data/imported`` into run records.

``tests/data/imported/sources.json`` lists every file with its kind (llama-bench, llama-log, vllm-bench, vllm-log or
vllm-speed-table, whose entry maps the table's model names to catalogue models),
the catalogue model and GPU it was measured with, and the URL it was copied from (a vllm-log entry also its weight
format and the settings the excerpt does not print). This module replays
``benchcal import`` over that list, so ``runs/imported`` can be rebuilt from the files at any time::

    python -m calibration.public_data runs/imported
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from calibration.importers import import_llama_bench
from calibration.importers_llama_log import import_llama_log
from calibration.importers_speed_table import import_speed_table
from calibration.importers_vllm import import_vllm_bench
from calibration.importers_vllm_log import import_vllm_log
from predictor.errors import BenchcalError

DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "imported"


def load_manifest(data_dir: str | Path = DATA_DIR) -> list[dict[str, Any]]:
    """The entries of ``sources.json`` (file, kind, model, gpu, url, excerpt, optional exclude_from_fit)."""
    path = Path(data_dir) / "sources.json"
    if not path.is_file():
        raise BenchcalError(f"no manifest at {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def import_public(runs_dir: str | Path, data_dir: str | Path = DATA_DIR) -> tuple[int, list[str]]:
    """Import every file of the manifest into ``runs_dir``; returns (records written, messages)."""
    total, messages = 0, []
    for entry in load_manifest(data_dir):
        file = Path(data_dir) / entry["file"]
        if entry["kind"] == "llama-bench":
            written, notes = import_llama_bench(file, model=entry["model"], runs_dir=runs_dir, gpu=entry.get("gpu"),
                                                source_url=entry["url"], exclude=entry.get("exclude_from_fit"))
        elif entry["kind"] == "llama-log":
            written, notes = import_llama_log(file, model=entry["model"], runs_dir=runs_dir, gpu=entry.get("gpu"),
                                              source_url=entry["url"], exclude=entry.get("exclude_from_fit"))
        elif entry["kind"] == "vllm-bench":
            written, notes = import_vllm_bench(file, model=entry["model"], runs_dir=runs_dir, gpu=entry.get("gpu"),
                                               source_url=entry["url"])
        elif entry["kind"] == "vllm-log":
            written, notes = import_vllm_log(file, model=entry["model"], runs_dir=runs_dir, gpu=entry["gpu"],
                                             quant=entry.get("quant", "BF16"), source_url=entry["url"],
                                             **entry.get("settings", {}))
        elif entry["kind"] == "vllm-speed-table":
            written, notes = import_speed_table(file, models=entry["models"], runs_dir=runs_dir, gpu=entry["gpu"],
                                                source_url=entry["url"])
        else:
            raise BenchcalError(f"{entry['file']}: unknown kind {entry['kind']!r}")
        total += len(written)
        messages += [f"{entry['file']}: {note}" for note in notes]
    return total, messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibration.public_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_dir", help="where the records go (e.g. runs/imported)")
    args = parser.parse_args(argv)
    total, messages = import_public(args.runs_dir)
    for message in messages:
        print(message)
    print(f"imported {total} record(s) into {args.runs_dir}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
