"""The parent side of an engine: what the harness does for it before the child process starts.

Each engine package has a ``setup.py`` whose ``SETUP`` is an :class:`EngineSetup`. It fills in the engine's
defaults (called while a configuration is normalized, before it is hashed), prepares its synthetic or hub weights,
gives the architecture a configuration measures, and says how runs of it are planned. Nothing here imports an
engine's library.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# engine options the harness itself sets or reads for every engine: the weights' repository, the GPU, the seed,
# threads, and flash attention (bench records it for every engine; the predictor reads it back from the record)
COMMON_OPTIONS = frozenset({"hub_repo", "gpu_index", "seed", "threads", "flash_attn"})


class EngineSetup:
    """Defaults for an engine that needs nothing of its own; engines override what differs."""

    name: str = ""
    # the quant ``benchcal bench`` records when none is given and the weights are not a file (None: the weights')
    default_quant: str | None = None
    # a GPU configuration predicted not to fit is replaced by the most GPU layers that fit (layer offload)
    replans_offload: bool = False
    # the engine options its engine, server and setup read, beside COMMON_OPTIONS; any other key is refused
    option_keys: frozenset[str] = frozenset()

    def fill_defaults(self, cfg: dict[str, Any]) -> None:
        """Fill in the engine's options in ``cfg`` (normalized already); BenchcalError for a bad option."""

    def arch(self, cfg: Mapping[str, Any]) -> Any:
        """The architecture ``cfg`` measures: its GGUF's, else the catalogue model's with its overrides."""
        return catalogue_arch(cfg)

    def synthetic_weights(self, cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Path of the synthetic weights to load and facts about them (None: the engine makes them itself)."""
        return None, {"weights_kind": "synthetic"}

    def hub_download(self, cfg: Mapping[str, Any], hub: Any, repo: str) -> str:
        """Download ``repo`` with ``huggingface_hub`` (``hub``); the path of what the engine loads."""
        return hub.snapshot_download(repo)

    def server_name(self, asked: str | None, local: bool = True) -> str:
        """The server a serving run of this engine uses: ``asked`` (``serve.server``) when it is one of those that
        serve it (:data:`predictor.load.SERVERS`), the first of them when None; BenchcalError otherwise or when the
        engine has no server. ``local``: the server runs on this machine, so what it needs must be found here
        (False for a server that is already running elsewhere, :mod:`harness.serving.external`)."""
        from predictor.errors import BenchcalError
        from predictor.load import SERVERS

        servers = SERVERS.get(self.name, ())
        if not servers:
            raise BenchcalError(f"the {self.name} engine has no server to measure under load")
        if asked is None:
            return servers[0]
        if asked not in servers:
            raise BenchcalError(f"serve.server {asked!r} does not serve {self.name} (choose from: "
                                f"{', '.join(servers)})")
        return asked

    def server(self, cfg: Mapping[str, Any] | None = None) -> ServerSetup:
        """How to serve the engine over HTTP (``benchcal bench --serve``) with the server ``cfg["serve"]`` names;
        BenchcalError when it has no server."""
        from predictor.errors import BenchcalError

        raise BenchcalError(f"the {self.name} engine has no server to measure under load")


class ServerSetup:
    """An engine's OpenAI-compatible server, as the serving harness (:mod:`harness.serving`) drives it."""

    ready_path = "/v1/models"  # answers 200 once the model is loaded
    metrics_path: str | None = None  # Prometheus metrics, where the server has them

    def command(self, cfg: Mapping[str, Any], weights_path: str | None, port: int) -> list[str]:
        """The command line that serves ``cfg`` on 127.0.0.1:``port``."""
        raise NotImplementedError

    def environment(self, cfg: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
        """The server's environment (``base`` plus what the engine reads)."""
        return dict(base)

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, lengths: list[int],
                seed: int) -> list[Any]:
        """Distinct prompts, one of exactly ``lengths[i]`` tokens as the running server counts them for each
        length."""
        raise NotImplementedError

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        """A streaming ``/v1/completions`` request that generates exactly ``output_tokens`` tokens."""
        raise NotImplementedError

    def version(self) -> dict[str, Any]:
        """The server's own ``engine_version`` / ``engine_build`` / ``engine_commit`` where it is a binary of its own
        (llama-server); {} where the engine's version is the server's (a Python package's server)."""
        return {}


def gguf_path(cfg: Mapping[str, Any]) -> Path | None:
    """The GGUF file ``cfg`` names as its weights, else None."""
    weights = str(cfg.get("weights") or "synthetic")
    path = Path(weights).expanduser()
    return path if weights not in ("synthetic", "hub") and path.suffix.lower() == ".gguf" else None


def catalogue_arch(cfg: Mapping[str, Any]) -> Any:
    """The architecture of ``cfg``'s GGUF file when it names one, else the catalogue model's with its overrides."""
    from harness import synthetic

    gguf = gguf_path(cfg)
    if gguf is not None and gguf.is_file():
        from predictor.models import resolve_model

        return resolve_model(str(gguf))
    return synthetic.resolve_arch(cfg["model"], cfg.get("arch_overrides"))


def default_threads() -> int:
    """CPU threads for llama.cpp: the physical cores, leaving one hardware thread to the harness's sampler.

    With SMT the sibling threads are free already; without it one core is left out (ggml's spinning thread
    barrier slows down many times over when any of its threads is preempted).
    """
    import psutil

    from harness.hostinfo import usable_cores

    logical = usable_cores()
    physical = int(psutil.cpu_count(logical=False) or logical)
    physical = min(physical, logical)
    return physical if logical > physical else max(1, physical - 1)


def sized_text(count_tokens: Callable[[str], int], n_tokens: int, rng: random.Random) -> str:
    """Random letters grown or trimmed until a server's tokenizer (``count_tokens``) counts ``n_tokens`` tokens;
    BenchcalError where 64 tries do not get there."""
    from predictor.errors import BenchcalError

    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(max(1, n_tokens - 4)))
    for _ in range(64):
        have = count_tokens(text)
        if have == n_tokens:
            return text
        if have < n_tokens:
            text += "".join(rng.choice(string.ascii_lowercase) for _ in range(n_tokens - have))
        else:
            text = text[: max(1, len(text) - (have - n_tokens))]
    raise BenchcalError(f"could not size a prompt to exactly {n_tokens} tokens with the server's tokenizer")


def token_windows(tokenize: Callable[[str], list[int]], lengths: list[int], rng: random.Random) -> list[list[int]]:
    """One prompt of token ids per length: windows of a server's tokenization (``tokenize``) of random words, so
    every id is an ordinary token of its vocabulary; BenchcalError where it gives fewer tokens than the longest."""
    from predictor.errors import BenchcalError

    longest = max(lengths, default=1)
    words = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
                     for _ in range(max(64, 2 * longest)))
    pool = tokenize(words)
    if len(pool) < longest:
        raise BenchcalError(f"the server's tokenizer gave {len(pool)} tokens, fewer than the {longest} asked for")
    out = []
    for n_tokens in lengths:
        start = rng.randrange(0, len(pool) - n_tokens + 1)
        out.append(pool[start:start + n_tokens])
    return out
