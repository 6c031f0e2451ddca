"""The transformers engine's parent side: nothing of its own (it builds its random-weight model in the child)."""

from __future__ import annotations

from harness.engines.setup import EngineSetup


class TransformersSetup(EngineSetup):
    name = "transformers"
    option_keys = frozenset({"attn_implementation"})


SETUP = TransformersSetup()
