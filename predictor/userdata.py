"""Where a user's own data lives, apart from the dataset shipped with benchcal.

The shipped dataset (``runs/`` and ``calibration/`` beside the packages) is read-only: runs a user measures
and the coefficients fitted to them go to the user's data directory, ``$BENCHCAL_HOME`` when set, else the
platform's user data directory (``platformdirs.user_data_dir("benchcal")``: ``~/.local/share/benchcal`` on
Linux). Inside it, ``runs/`` holds run records (``$BENCHCAL_RUNS`` overrides just that) and
``calibration/coefficients.json`` the user's fitted table, which ``predict`` consults first for the devices
it describes.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "BENCHCAL_HOME"
RUNS_ENV = "BENCHCAL_RUNS"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def benchcal_home() -> Path:
    """The user's data directory: ``$BENCHCAL_HOME``, else the platform's user data directory."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_data_dir
    except ImportError:  # platformdirs is a dependency; this keeps the predictor importable without it
        return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser() / "benchcal"
    return Path(user_data_dir("benchcal", appauthor=False))


def user_runs_dir() -> Path:
    """Where the user's run records go: ``$BENCHCAL_RUNS``, else ``<home>/runs``."""
    env = os.environ.get(RUNS_ENV)
    return Path(env).expanduser() if env else benchcal_home() / "runs"


def user_calibration_dir() -> Path:
    """Where ``benchcal calibrate`` writes the user's table: ``<home>/calibration``."""
    return benchcal_home() / "calibration"


def user_coefficients_path() -> Path | None:
    """The user's fitted table, if one has been written."""
    path = user_calibration_dir() / "coefficients.json"
    return path if path.is_file() else None


def shipped_runs_dir() -> Path:
    """The run records shipped with benchcal (read-only)."""
    return PACKAGE_ROOT / "runs"


def is_shipped(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is (inside) the shipped dataset: ``runs/`` or ``calibration/`` beside the packages."""
    try:
        resolved = Path(path).expanduser().resolve()
    except OSError:
        return False
    for root in (PACKAGE_ROOT / "runs", PACKAGE_ROOT / "calibration"):
        if resolved == root or root in resolved.parents:
            return True
    return False
