"""Argument types for the CLI's numeric options: each refuses what its option cannot mean (zero, negative,
not a number, infinite, out of range) while the command line is parsed, before anything runs, as one
``benchcal: error:`` line and exit code 2 (``benchcal.cli._Parser``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(kind: type, text: str) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _checked(kind: type, test: Callable[[float], bool], wanted: str) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        value = _number(kind, text)
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


positive_int = _checked(int, lambda v: v > 0, "a positive integer")
non_negative_int = _checked(int, lambda v: v >= 0, "zero or a positive integer")
positive_float = _checked(float, lambda v: v > 0, "a positive number")
non_negative_float = _checked(float, lambda v: v >= 0, "zero or a positive number")
fraction = _checked(float, lambda v: 0 <= v <= 1, "a fraction between 0 and 1")
share = _checked(float, lambda v: 0 < v <= 1, "a fraction above 0 and at most 1")


def output_file(text: str) -> str:
    """A file to write: not a folder, in a folder that exists (nothing is created to write it)."""
    from pathlib import Path

    path = Path(text).expanduser()
    if not text:
        raise argparse.ArgumentTypeError("needs a file name")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {path.parent} does not exist")
    return text


def output_dir(text: str) -> str:
    """A folder to write into: anything but an existing file (a missing one is created)."""
    from pathlib import Path

    path = Path(text).expanduser()
    if not text:
        raise argparse.ArgumentTypeError("needs a folder name")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise argparse.ArgumentTypeError(f"{text} is inside a file, not a folder")
    return text
