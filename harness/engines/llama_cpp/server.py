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
import string
import sys
import urllib.request
from collections.abc import Mapping
from typing import Any

from harness.engines.llama_cpp.engine import KV_TYPES
from harness.engines.setup import ServerSetup, default_threads
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

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, n_tokens: int, count: int,
                seed: int) -> list[Any]:
        rng = random.Random(seed)
        return [self._sized_text(base_url, n_tokens, rng) for _ in range(count)]

    def _sized_text(self, base_url: str, n_tokens: int, rng: random.Random) -> str:
        """Random letters grown or trimmed until the server's tokenizer counts ``n_tokens`` tokens."""
        text = "".join(rng.choice(string.ascii_lowercase) for _ in range(max(1, n_tokens - 4)))
        for _ in range(64):
            have = len(_tokenize(base_url, text))
            if have == n_tokens:
                return text
            if have < n_tokens:
                text += "".join(rng.choice(string.ascii_lowercase) for _ in range(n_tokens - have))
            else:
                text = text[: max(1, len(text) - (have - n_tokens))]
        raise BenchcalError(f"could not size a prompt to exactly {n_tokens} tokens with the server's tokenizer")

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        return {"prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens, "stream": True,
                "temperature": 0.0}


def _tokenize(base_url: str, text: str) -> list[int]:
    request = urllib.request.Request(base_url + "/extras/tokenize", data=json.dumps({"input": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30.0) as response:
        return list(json.loads(response.read())["tokens"])


SERVER = LlamaCppServer()
