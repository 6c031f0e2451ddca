"""The small protocol every inference engine implements, and what the runner needs to know about failures.

An engine object lives in the CHILD process started by :mod:`harness.engines.runner`. The runner calls,
in order::

    engine = EngineClass()
    info = engine.load(config, weights_path)          # -> LoadInfo
    timing = engine.measure_prompt(prompt_token_ids)   # -> PromptTiming   (warm-ups, then reps, per length)
    timing = engine.measure_decode(prompt_token_ids, n_gen)  # -> DecodeTiming  (warm-ups, then reps)
    engine.close()

``memory_breakdown(log_text)`` and ``version()`` are class methods: the parent calls them without loading
the engine (an engine module imports its library lazily, inside ``load`` / ``version``), so importing an
engine module never needs the engine installed.

Rules every engine keeps:
- prompts are exactly the token ids given (no BOS added, no template), and nothing of an earlier prompt is
  reused (clear the KV cache / prefix cache before each measurement);
- end-of-sequence is ignored: decode produces exactly ``n_gen`` tokens;
- timestamps are ``time.perf_counter()`` seconds taken in the child;
- the engine's own timers, when it has them, are reported beside the wall-clock figures.

Units: seconds for times (``*_s``), tokens for counts, bytes for memory (``*_bytes``).
"""

from __future__ import annotations

import abc
import importlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from harness.engines import ENGINE_CLASSES, ENGINE_PACKAGES
from predictor.errors import BenchcalError, suggest

# Out-of-memory messages common to CUDA programs (matched case-insensitively in the child's log).
COMMON_OOM_PATTERNS: tuple[str, ...] = (
    r"CUDA out of memory",
    r"cudaMalloc failed: out of memory",
    r"out of memory",
    r"std::bad_alloc",
    r"MemoryError",
    r"Cannot allocate memory",
)


@dataclass
class LoadInfo:
    """What loading produced. ``load_s``: wall-clock seconds from load start to ready."""

    load_s: float
    vocab_size: int
    n_ctx: int
    total_layers: int | None = None
    offloaded_layers: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromptTiming:
    """One prefill measurement.

    ``ttft_s``: submit of the prompt to the first generated token (wall clock, seconds).
    ``prefill_s``: submit to the end of prompt processing (wall clock, seconds; equals ``ttft_s`` for engines
    that cannot separate the two). ``engine_prefill_s`` / ``engine_prompt_tokens``: the engine's own prompt
    timer and token count, when it has one.
    """

    prompt_tokens: int
    ttft_s: float
    prefill_s: float
    engine_prefill_s: float | None = None
    engine_prompt_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DecodeTiming:
    """One decode measurement.

    ``submit_s``: perf_counter when the prompt was submitted; ``token_times_s``: perf_counter when each
    generated token became available (first token first, ``n_gen`` entries). ``batch``: sequences decoded
    together (each timestamp covers one token of every sequence). ``engine_decode_s`` /
    ``engine_decode_tokens``: the engine's own decode timer and count (tokens after the first), if any.
    """

    context_at_start: int
    submit_s: float
    token_times_s: list[float]
    batch: int = 1
    engine_decode_s: float | None = None
    engine_decode_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_tok_s(token_times_s: Sequence[float], batch: int = 1) -> float | None:
    """Decode throughput in tokens/s: ``batch * (n - 1) / (t_last - t_first)``; None with < 2 tokens."""
    if len(token_times_s) < 2:
        return None
    span_s = token_times_s[-1] - token_times_s[0]
    return batch * (len(token_times_s) - 1) / span_s if span_s > 0 else None


def prefill_tok_s(prompt_tokens: int, prefill_s: float | None) -> float | None:
    """Prefill throughput in tokens/s: ``prompt_tokens / prefill_s``."""
    if not prefill_s or prefill_s <= 0:
        return None
    return prompt_tokens / prefill_s


def random_token_ids(
    n_tokens: int, vocab_size: int, rng: random.Random, excluded_ids: Sequence[int] = ()
) -> list[int]:
    """``n_tokens`` uniformly random ids in ``[0, vocab_size)`` avoiding ``excluded_ids`` (BOS, EOS, ...)."""
    excluded = set(excluded_ids)
    if vocab_size - len(excluded & set(range(vocab_size))) <= 0:
        raise ValueError("no ordinary token ids left to draw from")
    ids: list[int] = []
    while len(ids) < n_tokens:
        token = rng.randrange(vocab_size)
        if token not in excluded:
            ids.append(token)
    return ids


class Engine(abc.ABC):
    """Base class of engine adapters. Subclasses set ``name`` and ``oom_patterns`` and implement the methods."""

    name: ClassVar[str] = ""
    # Regular expressions (case-insensitive) that, found in the child's log, mean out of memory.
    oom_patterns: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.vocab_size: int = 0
        self.special_token_ids: set[int] = set()

    @abc.abstractmethod
    def load(self, config: Mapping[str, Any], weights_path: str | None) -> LoadInfo:
        """Load the model described by the run ``config`` (a normalized record config) from ``weights_path``."""

    @abc.abstractmethod
    def measure_prompt(self, prompt_token_ids: Sequence[int]) -> PromptTiming:
        """Process a fresh prompt (no reuse of earlier prompts) and produce one token; return the timing."""

    @abc.abstractmethod
    def measure_decode(self, prompt_token_ids: Sequence[int], n_gen: int) -> DecodeTiming:
        """Process a fresh prompt, then generate exactly ``n_gen`` tokens ignoring end-of-sequence."""

    @classmethod
    def memory_breakdown(cls, log_text: str) -> dict[str, Any]:
        """The engine's own memory figures parsed from its log (bytes). Empty when nothing is found."""
        return {}

    @classmethod
    def version(cls) -> dict[str, Any]:
        """``{"engine_version", "engine_commit", "engine_build"}``; values None when unknown."""
        return {"engine_version": None, "engine_commit": None, "engine_build": None}

    def close(self) -> None:  # noqa: B027 - optional hook, engines without resources keep the default
        """Free the model and everything the engine holds."""
        return None

    def random_prompt(self, n_tokens: int, rng: random.Random) -> list[int]:
        """Random ordinary token ids of exact length, avoiding the engine's special ids."""
        return random_token_ids(n_tokens, self.vocab_size, rng, sorted(self.special_token_ids))


def engine_class(name: str) -> type[Engine]:
    """The engine class registered under ``name``; BenchcalError for an unknown name."""
    if name not in ENGINE_CLASSES:
        raise BenchcalError(f"unknown engine {name!r}{suggest(name, ENGINE_PACKAGES)}")
    module_name, class_name = ENGINE_CLASSES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BenchcalError(f"engine {name!r} is not available: {exc}") from exc
    return getattr(module, class_name)


def find_oom(log_text: str, patterns: Sequence[str] = ()) -> str | None:
    """The first log line matching an out-of-memory pattern (engine patterns first), else None."""
    compiled = [re.compile(p, re.IGNORECASE) for p in (*patterns, *COMMON_OOM_PATTERNS)]
    for line in log_text.splitlines():
        if any(rx.search(line) for rx in compiled):
            return line.strip()[:300]
    return None


def classify_failure(
    returncode: int | None,
    log_text: str,
    oom_patterns: Sequence[str] = (),
    timed_out: bool = False,
    interrupted: bool = False,
    child_error: str | None = None,
) -> tuple[str, str | None]:
    """Status and one-line reason for a finished child: ``ok``, ``oom``, ``crash``, ``timeout``, ``interrupted``.

    Order: interrupted (SIGINT/SIGTERM to the harness) > timeout > out-of-memory text in the log or the
    child's error message > nonzero exit or a signal (crash) > ok.
    """
    if interrupted:
        return "interrupted", "interrupted by the user (SIGINT/SIGTERM)"
    if timed_out:
        return "timeout", "the engine exceeded its time limit and was killed"
    oom_line = find_oom(child_error or "", oom_patterns) or find_oom(log_text, oom_patterns)
    if oom_line is not None and (returncode not in (0, None) or child_error):
        return "oom", oom_line
    if child_error:
        return "crash", child_error.splitlines()[0][:300]
    if returncode is None:
        return "crash", "the engine process vanished without an exit status"
    if returncode < 0:
        return "crash", f"the engine process was killed by signal {-returncode}"
    if returncode != 0:
        return "crash", f"the engine process exited with status {returncode}"
    return "ok", None
