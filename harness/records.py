"""Run records: building them and their atomic store (the schema is :mod:`harness.record_schema`, the pandas
loaders are in :mod:`harness.record_tables`).

A run record is one JSON document describing one measured (or failed) configuration. This module is
the contract between the harness that writes records and the calibration that reads them, so it imports
no engine: only the standard library.

Layout on disk: ``<runs_dir>/<engine>/<device>/<model>/<id>.json``. Records are written atomically
(temporary file in the same directory, fsync, then a link or rename that never overwrites).

Units: times in the record carry their unit in the key (``ttft_ms``, ``load_s``), throughputs are tokens
per second (``*_tok_s``), memory is in bytes (``*_bytes``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import math
import os
import re
import secrets
import statistics
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from harness.record_schema import (  # noqa: F401  (the schema's names, re-exported for the record's readers)
    CONFIG_DEFAULTS,
    ENGINES,
    MODEL_SOURCES,
    PEAK_SOURCES,
    PROVENANCE_SOURCES,
    RECORD_KEYS,
    SCHEMA_VERSION,
    STATUSES,
    RunRecord,
    migrate,
    validate_record,
)

# Keys of ``config`` that do not change what is measured; left out of the config hash.
VOLATILE_CONFIG_KEYS = frozenset({"label", "notes", "sweep", "timeout_s", "runs_dir"})

_SAFE_COMPONENT = re.compile(r"[^A-Za-z0-9._+-]+")
RUNS_ENV = "BENCHCAL_RUNS"


# --------------------------------------------------------------------------------------------- summaries


def summarize(samples: Iterable[float]) -> dict[str, Any]:
    """Summary of repeated samples: every sample kept, plus median, mean, stddev (n-1), p10, p90, n.

    Non-finite samples are dropped. An empty input gives ``n = 0`` and ``None`` statistics.
    """
    values = [float(s) for s in samples if s is not None and math.isfinite(float(s))]
    if not values:
        return {"samples": [], "median": None, "mean": None, "stddev": None, "p10": None, "p90": None, "n": 0}
    ordered = sorted(values)
    return {
        "samples": values,
        "median": statistics.median(ordered),
        "mean": statistics.fmean(ordered),
        "stddev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
        "p10": percentile(ordered, 10.0),
        "p90": percentile(ordered, 90.0),
        "n": len(ordered),
    }


def percentile(ordered: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default method) of an ascending list; None for an empty one."""
    if not ordered:
        return None
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ------------------------------------------------------------------------------------------------ config


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return a deep copy of ``config`` with every default key present and prompt lengths as sorted ints."""
    out = copy.deepcopy(CONFIG_DEFAULTS)
    out.update(copy.deepcopy(dict(config)))
    prompts = out.get("prompt_tokens") or []
    if isinstance(prompts, int):
        prompts = [prompts]
    out["prompt_tokens"] = sorted({int(p) for p in prompts})
    out["engine_options"] = dict(out.get("engine_options") or {})
    return out


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of the normalized config, volatile keys left out."""
    normalized = normalize_config(config)
    stable = {k: v for k, v in normalized.items() if k not in VOLATILE_CONFIG_KEYS}
    canonical = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def utc_now() -> str:
    """Current UTC time as ISO 8601 with a Z suffix, second precision."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_record_id(config_hash_hex: str, when: _dt.datetime | None = None) -> str:
    """``<UTC yyyymmddTHHMMSSZ>-<config_hash[:10]>-<4 random hex>``."""
    moment = when or _dt.datetime.now(_dt.timezone.utc)
    stamp = moment.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{config_hash_hex[:10]}-{secrets.token_hex(2)}"


def new_record(
    config: Mapping[str, Any],
    status: str = "ok",
    reason: str | None = None,
    measurements: Mapping[str, Any] | None = None,
    memory: Mapping[str, Any] | None = None,
    prediction: Mapping[str, Any] | None = None,
    planned: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    log_tail: Iterable[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build a run record (the plain dict of a :class:`RunRecord`) with a fresh id and the config hash.

    ``provenance`` defaults to ``{"source": "measured"}``; ``prediction`` may be ``None`` (then say why in
    ``extra["prediction_reason"]`` or inside the prediction dict). Extra keyword arguments (for example
    ``prediction_error``) are stored at the top level.
    """
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    normalized = normalize_config(config)
    digest = config_hash(normalized)
    prov = {"source": "measured"}
    prov.update(dict(provenance or {}))
    return RunRecord(
        id=new_record_id(digest), config_hash=digest, status=status, reason=reason, config=normalized,
        measurements=dict(measurements or {}), memory=dict(memory) if memory is not None else {},
        prediction=dict(prediction) if prediction is not None else None,
        planned=dict(planned) if planned is not None else None, provenance=prov, log_tail=list(log_tail or []),
        extra=dict(extra),
    ).to_dict()


# ------------------------------------------------------------------------------------------------- store


def runs_dir(cli_value: str | os.PathLike[str] | None = None) -> Path:
    """Where run records live: the command-line value, else ``$BENCHCAL_RUNS``, else the user's data directory
    (``$BENCHCAL_HOME/runs``; :mod:`predictor.userdata`). Never the shipped ``runs/`` unless named."""
    if cli_value:
        return Path(cli_value).expanduser()
    from predictor.userdata import user_runs_dir

    return user_runs_dir()


def safe_component(name: Any) -> str:
    """A path component made from ``name``: runs of unsafe characters become ``_``."""
    text = _SAFE_COMPONENT.sub("_", str(name if name is not None else "unknown")).strip("._")
    return text or "unknown"


def record_path(record: Mapping[str, Any], root: str | os.PathLike[str]) -> Path:
    """``root/<engine>/<device>/<model>/<id>.json`` for ``record``."""
    config = record["config"]
    return (
        Path(root)
        / safe_component(config.get("engine"))
        / safe_component(config.get("device"))
        / safe_component(config.get("model"))
        / f"{record['id']}.json"
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish_without_overwrite(tmp: Path, final: Path) -> bool:
    """Move ``tmp`` to ``final`` atomically unless ``final`` exists; True on success."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        return False
    except OSError:
        # Filesystems without hard links: reserve the name exclusively, then replace the placeholder.
        try:
            fd = os.open(final, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        os.replace(tmp, final)
        return True
    os.unlink(tmp)
    return True


@contextlib.contextmanager
def store_lock(runs_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock on a runs directory while reading what it holds and writing to it, so that writers
    in parallel processes (imports that skip what is stored) see each other's records. The lock file lives in the
    system's temporary directory, keyed by the directory's real path: nothing is added to the runs directory."""
    import fcntl

    key = hashlib.sha256(str(Path(runs_dir).expanduser().resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "benchcal-locks" / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_record(record: dict[str, Any], runs_dir: str | os.PathLike[str], attempts: int = 20) -> Path:
    """Validate and store ``record`` atomically; return its path. Never overwrites an existing record.

    If the id is taken (same second, same config, same random suffix) a new random suffix is drawn and
    ``record["id"]`` is updated in place.
    """
    validate_record(record)
    for _ in range(attempts):
        final = record_path(record, runs_dir)
        final.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps(_sanitize(record), indent=1, allow_nan=False, default=_json_default)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{record['id']}.", suffix=".tmp", dir=final.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
                handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
            if _publish_without_overwrite(tmp, final):
                _fsync_dir(final.parent)
                return final
        finally:
            if tmp.exists():
                tmp.unlink()
        record["id"] = record["id"][:-4] + secrets.token_hex(2)
    raise FileExistsError(f"could not find a free record name under {Path(runs_dir)} after {attempts} attempts")


MIN_FREE_BYTES = 16 * 2**20  # room for a record and the engine's log


def ensure_writable(runs_dir: str | os.PathLike[str]) -> Path:
    """Check before a run that its record can be stored: ``runs_dir`` is (or can be made) a writable directory
    with room left; BenchcalError naming the problem otherwise, so no measurement is made only to be lost."""
    from predictor.errors import BenchcalError

    root = Path(runs_dir)
    if root.exists() and not root.is_dir():
        raise BenchcalError(f"runs directory {root} is a file")
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".benchcal-write-probe.", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BenchcalError(f"runs directory {root} is not writable ({exc.strerror or exc})") from None
    import shutil

    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        raise BenchcalError(f"runs directory {root} has {free / 2**20:.1f} MiB free; a run needs "
                            f"{MIN_FREE_BYTES // 2**20} MiB for its record and log")
    return root


def store_record(record: dict[str, Any], runs_dir: str | os.PathLike[str],
                 say: Callable[[str], None] | None = None) -> Path:
    """:func:`write_record`, and when that fails (disk full, directory gone or read-only) the record goes to the
    fallback directory (``$BENCHCAL_CACHE/unsaved-records``, else the system's temporary directory) and ``say``
    tells where: a finished measurement is never lost."""
    try:
        return write_record(record, runs_dir)
    except OSError as exc:
        for fallback in _fallback_dirs():
            try:
                path = write_record(record, fallback)
            except OSError:
                continue
            (say or print)(f"warning: could not store the record under {runs_dir} ({exc.strerror or exc}); "
                           f"saved it to {path} instead")
            return path
        raise


def _fallback_dirs() -> list[Path]:
    base = os.environ.get("BENCHCAL_CACHE")
    dirs = [Path(base) / "unsaved-records"] if base else []
    return [*dirs, Path(tempfile.gettempdir()) / "benchcal-unsaved-records"]


def _json_default(value: Any) -> Any:
    """JSON encoding for numpy scalars/arrays and paths; NaN becomes null."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _sanitize(value: Any) -> Any:
    """Replace non-finite floats by None so records stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sanitize(v) for v in value]
    return value


def sanitize_record(record: dict[str, Any]) -> dict[str, Any]:
    """Return ``record`` with NaN/inf replaced by null (call before :func:`write_record` on computed data)."""
    return _sanitize(record)


class StoredRun(NamedTuple):
    """A record read back from disk with the file it came from."""

    path: Path
    record: dict[str, Any]


def _warn_unreadable(path: Path, message: str) -> None:
    warnings.warn(f"skipping unreadable run record {path}: {message}", stacklevel=3)


def iter_records(
    runs_dir: str | os.PathLike[str],
    on_error: Callable[[Path, str], None] | None = None,
) -> Iterator[StoredRun]:
    """Yield every valid record under ``runs_dir`` (sorted by path) as ``StoredRun(path, record)``.

    Unreadable or malformed files are skipped and reported through ``on_error(path, message)`` (default:
    a warning); temporary files of writers in progress are ignored. Never raises for a bad file.
    """
    report = on_error or _warn_unreadable
    root = Path(runs_dir)
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            with path.open(encoding="utf-8") as handle:
                record = migrate(json.load(handle))
            validate_record(record)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            report(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            continue
        yield StoredRun(path, record)


def ok_config_hashes(runs_dir: str | os.PathLike[str], host_id: str | None = None) -> set[str]:
    """Config hashes that already have a record with status ``ok`` (used to resume sweeps).

    A record measured in place of a planned config (``planned.config_hash``) covers that config too. With
    ``host_id``, a CPU run counts only when that host measured it (``provenance.host_id``): the same config
    on another CPU is not measured yet.
    """
    hashes: set[str] = set()
    for run in iter_records(runs_dir, on_error=lambda path, message: None):
        if run.record["status"] != "ok":
            continue
        config, provenance = run.record.get("config") or {}, run.record.get("provenance") or {}
        if host_id and config.get("device") == "cpu" and provenance.get("host_id") != host_id:
            continue
        hashes.add(run.record["config_hash"])
        planned = run.record.get("planned") or {}
        if planned.get("config_hash"):
            hashes.add(planned["config_hash"])
    return hashes
