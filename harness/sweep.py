"""Sweeps: a TOML file of run configs with shared defaults, run in order, resumable.

Format::

    name = "cpu-smoke"
    description = "..."
    timeout_s = 300                     # per run (optional)

    [defaults]                          # applied to every config
    engine = "llama.cpp"
    device = "cpu"
    context = 1024
    prompt_tokens = [64, 256]
    gen_tokens = 32
    reps = 5
    [defaults.engine_options]
    threads = 2

    [[configs]]
    model = "smollm2-135m"
    quant = ["Q4_0", "Q8_0"]            # a list in any key but prompt_tokens expands into one config each

A sweep resumes: a config whose hash already has a record with status ``ok`` (or whose planned config
has one) is skipped. ``engine_options`` tables merge key by key with the defaults'.
"""

from __future__ import annotations

import copy
import itertools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import records
from predictor.errors import BenchcalError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SWEEPS_DIR = Path(__file__).parent / "sweeps"
LIST_VALUED_KEYS = frozenset({"prompt_tokens"})


@dataclass
class Sweep:
    """A parsed sweep file: its name, description, per-run timeout and expanded configs."""

    name: str
    description: str
    configs: list[dict[str, Any]]
    timeout_s: float | None = None
    path: Path | None = None


def find_sweep(name_or_path: str) -> Path:
    """A sweep file by path, or by name among the shipped ones (``cpu-smoke`` -> harness/sweeps/cpu-smoke.toml)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = SWEEPS_DIR / f"{name_or_path.removesuffix('.toml')}.toml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
    raise BenchcalError(f"no sweep file {name_or_path!r} (shipped sweeps: {', '.join(names)})")


def expand(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One config per combination of list-valued keys (except prompt lengths and engine options)."""
    fixed = {k: v for k, v in entry.items() if not (isinstance(v, list) and k not in LIST_VALUED_KEYS)}
    varying = {k: v for k, v in entry.items() if isinstance(v, list) and k not in LIST_VALUED_KEYS}
    if not varying:
        return [dict(fixed)]
    keys = list(varying)
    return [{**fixed, **dict(zip(keys, combo, strict=True))} for combo in itertools.product(*varying.values())]


def merge(defaults: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overridden by ``entry``; ``engine_options`` and ``arch_overrides`` merge key by key."""
    merged = copy.deepcopy(dict(defaults))
    for key, value in entry.items():
        if key in ("engine_options", "arch_overrides") and isinstance(value, Mapping):
            merged[key] = {**(merged.get(key) or {}), **value}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_sweep(name_or_path: str) -> Sweep:
    """Parse a sweep file; BenchcalError for a missing file, bad TOML or a config without a model."""
    path = find_sweep(name_or_path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BenchcalError(f"sweep file {path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError:
        raise BenchcalError(f"sweep file {path} is not a text file (not UTF-8)") from None
    except OSError as exc:
        raise BenchcalError(f"cannot read sweep file {path}: {exc.strerror or exc}") from None
    from harness.config_schema import check_sweep

    check_sweep(data, path)  # the file's structure, keys and types (jsonschema), before any entry is expanded
    defaults = data.get("defaults") or {}
    entries = data["configs"]
    configs = []
    for number, entry in enumerate(entries, 1):
        for config in expand(merge(defaults, entry)):
            if not config.get("model"):
                raise BenchcalError(f"sweep file {path}: config {number} has no model")
            configs.append(config)
    timeout = data.get("timeout_s")
    return Sweep(str(data.get("name") or path.stem), str(data.get("description") or ""), configs,
                 float(timeout) if timeout else None, path)


def pending(configs: list[dict[str, Any]], runs_dir: str | os.PathLike[str],
            host_id: str | None = None) -> tuple[list[dict], list[dict]]:
    """Split configs into (to run, already measured ok) by config hash (CPU configs: on host ``host_id``)."""
    done = records.ok_config_hashes(runs_dir, host_id)
    todo, skipped = [], []
    for config in configs:
        (skipped if records.config_hash(config) in done else todo).append(config)
    return todo, skipped
