"""User-facing errors: anything a user can fix by changing their input.

The CLI turns a :class:`BenchcalError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BenchcalError(Exception):
    """Bad input or a missing resource the user can fix. Message is one line."""


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return ' (did you mean: a, b?)' for close matches of ``name``, or '': the candidates that hold it whole,
    shortest first (``3090`` -> rtx-3090, rtx-3090-ti; ``m3-max`` -> the M3 Max machines), else spelling neighbours
    (a neighbour beside a candidate that holds the name, ``b300`` for ``3090``, would only mislead)."""
    pool = list(dict.fromkeys(candidates))
    lowered = {c.lower(): c for c in pool}
    wanted = name.lower().strip()
    close = sorted((c for c in lowered if wanted and wanted in c), key=lambda c: (len(c), c))[:n]
    if not close:
        close = difflib.get_close_matches(wanted, list(lowered), n=n, cutoff=0.5)
    close = close[:n]
    if not close:
        return ""
    return " (did you mean: " + ", ".join(lowered[c] for c in close) + "?)"


def positive(name: str, value: float | int) -> float | int:
    """Raise BenchcalError unless ``value`` > 0."""
    if value is None or not value > 0:
        raise BenchcalError(f"{name} must be a positive number, got {value!r}")
    return value


def non_negative(name: str, value: float | int) -> float | int:
    if value is None or not value >= 0:
        raise BenchcalError(f"{name} must be zero or positive, got {value!r}")
    return value
