"""User-facing errors: anything a user can fix by changing their input.

The CLI turns a :class:`BenchcalError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BenchcalError(Exception):
    """Bad input or a missing resource the user can fix. Message is one line."""


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return ' (did you mean: a, b?)' for close matches of ``name``, or ''."""
    pool = list(dict.fromkeys(candidates))
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:
        close = [c for c in lowered if name.lower() in c][:n]
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
