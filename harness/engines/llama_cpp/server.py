"""llama.cpp's OpenAI-compatible server: llama-cpp-python's ``llama_cpp.server`` (the ``llama-server`` binary is not
part of llama-cpp-python's wheel).

One ``Llama`` serves every request in turn: a request that arrives while another streams waits for it (with
``--interrupt_requests false``; the server's default would cut the running stream short). Prompts are text sized
with the server's own tokenizer (``/extras/tokenize``) to exactly the tokens asked for; ``min_tokens`` equal to
``max_tokens`` makes it generate exactly that many (end-of-sequence is held back until then).
"""

from __future__ import annotations

import json
import random
import sys
import urllib.request
from collections.abc import Mapping
from typing import Any

from harness.engines.llama_cpp.engine import KV_TYPES
from harness.engines.setup import ServerSetup, default_threads, sized_text, token_windows
from predictor.errors import BenchcalError


def _flag(value: Any) -> str:
    return "true" if value else "false"


class LlamaCppServer(ServerSetup):
    ready_path = "/v1/models"
    metrics_path = None  # llama_cpp.server exposes no Prometheus metrics

    def command(self, cfg: Mapping[str, Any], weights_path: str | None, port: int) -> list[str]:
        if not weights_path:
            raise BenchcalError("llama.cpp's server needs a GGUF file")
        options = cfg.get("engine_options") or {}
        threads = int(options.get("threads") or default_threads())
        kv = str(cfg.get("kv_dtype") or "f16").lower()  # one llama.cpp has: checked by LlamaCppSetup.fill_defaults
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(weights_path), "--host", "127.0.0.1",
                "--port", str(port), "--n_ctx", str(int(cfg["context"])), "--n_threads", str(threads),
                "--n_threads_batch", str(threads), "--n_gpu_layers", str(int(options.get("n_gpu_layers", -1))),
                "--n_batch", str(int(options.get("n_batch") or 512)), "--n_ubatch", str(int(options.get("n_ubatch") or 512)),
                "--flash_attn", _flag(options.get("flash_attn")), "--type_k", str(KV_TYPES[kv]),
                "--type_v", str(KV_TYPES[kv]), "--cache", "false", "--interrupt_requests", "false",
                "--disable_ping_events", "true", "--verbose", "true"]

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, lengths: list[int],
                seed: int) -> list[Any]:
        """Random letters sized to each length by the server's tokenizer (its completions take text only)."""
        rng = random.Random(seed)
        return [sized_text(lambda text: len(_tokenize(base_url, text)), n_tokens, rng) for n_tokens in lengths]

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        return {"prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens, "stream": True,
                "temperature": 0.0}


def _tokenize(base_url: str, text: str) -> list[int]:
    request = urllib.request.Request(base_url + "/extras/tokenize", data=json.dumps({"input": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30.0) as response:
        return list(json.loads(response.read())["tokens"])


SERVER = LlamaCppServer()


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp's own server binary, where one exists
# ---------------------------------------------------------------------------------------------------------------

LLAMA_SERVER_ENV = "BENCHCAL_LLAMA_SERVER"  # the llama-server binary to use (else the one on PATH)


def find_llama_server(environ: Mapping[str, str] | None = None) -> str | None:
    """The ``llama-server`` binary: ``$BENCHCAL_LLAMA_SERVER`` when set (BenchcalError when it is not an executable
    file), else ``llama-server`` on PATH, else None."""
    import os
    import shutil

    env = os.environ if environ is None else environ
    named = env.get(LLAMA_SERVER_ENV)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise BenchcalError(f"{LLAMA_SERVER_ENV}={named} is not an executable file")
        return named
    return shutil.which("llama-server", path=env.get("PATH"))


class LlamaServerBinary(ServerSetup):
    """llama.cpp's ``llama-server``: continuous batching over ``-np`` slots, here ``serve.max_num_seqs`` of them, in
    one unified KV cache of ``context`` tokens per slot (``--kv-unified``, ``-c`` context x slots), so each request
    may use the run's whole context as with vLLM's ``max_model_len``. Prompts are token ids (ordinary tokens of the
    model's vocabulary as the server's ``/tokenize`` gives them); ``ignore_eos`` with ``max_tokens`` makes it
    generate exactly that many. ``/metrics`` (``--metrics``) gives its requests processing and deferred and its
    token counters."""

    ready_path = "/health"  # 503 while the model loads, 200 once it serves
    metrics_path = "/metrics"

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def command(self, cfg: Mapping[str, Any], weights_path: str | None, port: int) -> list[str]:
        if not weights_path:
            raise BenchcalError("llama.cpp's server needs a GGUF file")
        options = cfg.get("engine_options") or {}
        threads = int(options.get("threads") or default_threads())
        kv = str(cfg.get("kv_dtype") or "f16").lower()
        slots = int((cfg.get("serve") or {}).get("max_num_seqs") or 1)
        layers = int(options.get("n_gpu_layers", -1))
        return [self.binary, "--model", str(weights_path), "--host", "127.0.0.1", "--port", str(port),
                "--ctx-size", str(int(cfg["context"]) * slots), "--parallel", str(slots), "--kv-unified",
                "--threads", str(threads), "--threads-batch", str(threads),
                "--n-gpu-layers", "all" if layers < 0 else str(layers),
                "--batch-size", str(int(options.get("n_batch") or 2048)),
                "--ubatch-size", str(int(options.get("n_ubatch") or 512)),
                "--flash-attn", "on" if options.get("flash_attn") else "off", "--cache-type-k", kv,
                "--cache-type-v", kv, "--metrics", "--no-webui"]

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, lengths: list[int],
                seed: int) -> list[Any]:
        """Windows of each length's ids from the server's tokenization of random words (ordinary tokens only)."""
        return token_windows(lambda words: _llama_server_tokenize(base_url, words), lengths, random.Random(seed))

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        return {"prompt": prompt, "max_tokens": output_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.0, "cache_prompt": False}

    def version(self) -> dict[str, Any]:
        """``llama-server --version``: its version, build number and commit, as releases print them (``version:
        7216 (a1b2c3d)``) and as newer sources do (``version: 0.5.0-dev (build 1, commit 0c1e570)``). A build made
        outside a git checkout says build 0 or 1: no build number then."""
        import subprocess

        try:
            done = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return {}
        return parse_llama_server_version(done.stdout + done.stderr)


def parse_llama_server_version(text: str) -> dict[str, Any]:
    """``{engine_version, engine_build, engine_commit}`` from ``llama-server --version``'s output ({} when it has no
    version line)."""
    import re

    newer = re.search(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*(\w+)\)", text)
    older = re.search(r"version:\s*(\d+)\s*\((\w+)\)", text)
    if newer:
        version, build, commit = newer.group(1), int(newer.group(2)), newer.group(3)
    elif older:
        version, build, commit = older.group(1), int(older.group(1)), older.group(2)
    else:
        return {}
    return {"engine_version": f"llama-server {version}" + (f" (build {build})" if not older else ""),
            "engine_build": build if build > 1 else None,
            "engine_commit": None if commit == "unknown" else commit}


def _llama_server_tokenize(base_url: str, text: str) -> list[int]:
    request = urllib.request.Request(base_url + "/tokenize", data=json.dumps({"content": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30.0) as response:
        return [int(t) for t in json.loads(response.read())["tokens"]]
