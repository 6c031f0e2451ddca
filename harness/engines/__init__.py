"""The engines the harness measures: one package per engine, and the engine set, defined here once.

An engine package ``harness/engines/<package>/`` holds:

- ``setup.py``: the parent side, which never imports the engine's library: ``SETUP``, an
  :class:`harness.engines.setup.EngineSetup` that fills in the engine's defaults, prepares its weights and says
  how the harness plans its runs;
- ``engine.py``: the child side, an :class:`harness.engines.base.Engine` that loads and measures (it imports its
  library inside ``load``);
- ``logparse.py``: the parsers of the engine's log (memory lines, out-of-memory messages);
- whatever else the engine needs (vLLM: ``options.py``, shared by both sides, and ``child.py``, its session).

Adding an engine is one package here, one entry in ``ENGINE_PACKAGES`` and its tests; the predictor describes an
engine in :mod:`predictor.engines` (see ``docs/adding-an-engine.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from predictor.errors import BenchcalError, suggest

if TYPE_CHECKING:
    from harness.engines.setup import EngineSetup

# engine name -> (package under harness/engines/, class of its engine.py)
ENGINE_PACKAGES: dict[str, tuple[str, str]] = {
    "llama.cpp": ("llama_cpp", "LlamaCppEngine"),
    "vllm": ("vllm", "VllmEngine"),
    "transformers": ("transformers", "TransformersEngine"),
}
ENGINES: tuple[str, ...] = tuple(ENGINE_PACKAGES)
# engine name -> "module:Class" of its child-side engine; modules are imported only when the engine is used
ENGINE_CLASSES: dict[str, str] = {name: f"harness.engines.{package}.engine:{cls}"
                                  for name, (package, cls) in ENGINE_PACKAGES.items()}


def _known(name: str) -> str:
    if name not in ENGINE_PACKAGES:
        raise BenchcalError(f"unknown engine {name!r}{suggest(name, ENGINE_PACKAGES)}")
    return ENGINE_PACKAGES[name][0]


def engine_setup(name: str) -> EngineSetup:
    """The parent-side setup of engine ``name`` (engine-free); BenchcalError for an unknown name."""
    return importlib.import_module(f"harness.engines.{_known(name)}.setup").SETUP
