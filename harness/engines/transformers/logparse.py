"""Parsers of the transformers engine's log: the ``benchcal transformers: key=value`` memory lines it prints, and
torch's out-of-memory messages."""

from __future__ import annotations

import re
from typing import Any

TORCH_OOM_PATTERNS = (r"torch\.OutOfMemoryError", r"CUDA out of memory", r"OutOfMemoryError")
MEMORY_LINE = re.compile(r"benchcal transformers: (.*)$")
KEY_VALUE = re.compile(r"(\w+)=(-?\d+)")


def parse_memory_lines(log_text: str) -> dict[str, Any]:
    """The engine's ``benchcal transformers: key=value`` figures (bytes); the last value of each key wins."""
    figures: dict[str, Any] = {}
    for line in log_text.splitlines():
        match = MEMORY_LINE.search(line)
        if match:
            figures.update({k: int(v) for k, v in KEY_VALUE.findall(match.group(1))})
    return figures
