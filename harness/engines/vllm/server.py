"""vLLM's OpenAI-compatible server (``vllm serve``, run as ``python -m vllm.entrypoints.openai.api_server``).

It is built with the options the offline engine gets (:func:`harness.engines.vllm.child.llm_kwargs`: the same KV
pool, dtype, prefix caching off, no tokenizer), turned into command-line flags, with ``max_num_seqs`` the most
sequences the load runs at once. Prompts are random token ids (no tokenizer needed); ``ignore_eos`` and
``min_tokens`` equal to ``max_tokens`` make it generate exactly the tokens asked for; its Prometheus ``/metrics``
say how many requests ran and waited, how full the KV cache was and how many were preempted.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.engines.base import random_token_ids
from harness.engines.setup import ServerSetup
from harness.engines.vllm.options import hf_text_config, special_token_ids, vllm_environment

SERVED_NAME = "benchcal"
# LLM keyword arguments that are booleans on the command line: True -> --flag; False -> --no-flag or nothing
_NEGATABLE = {"enable_prefix_caching"}
_SWITCHES = {"enforce_eager", "skip_tokenizer_init", "trust_remote_code"}
_LEFT_OUT = {"disable_log_stats"}  # the server logs its stats unless told not to


def server_flags(kwargs: Mapping[str, Any]) -> list[str]:
    """``vllm.LLM`` keyword arguments as ``vllm serve`` flags (None values left out)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        if value is None or key in _LEFT_OUT:
            continue
        flag = "--" + key.replace("_", "-")
        if key in _NEGATABLE:
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif key in _SWITCHES:
            if value:
                flags.append(flag)
        else:
            flags += [flag, str(value)]
    return flags


class VllmServer(ServerSetup):
    ready_path = "/v1/models"
    metrics_path = "/metrics"

    def command(self, cfg: Mapping[str, Any], weights_path: str | None, port: int) -> list[str]:
        from harness.engines.vllm.child import llm_kwargs

        model_dir, load_format, hf_config = _model(cfg, weights_path)
        kwargs, _resolved = llm_kwargs(cfg, model_dir, load_format, hf_config)
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *server_flags(kwargs),
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port)]

    def environment(self, cfg: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
        """:func:`vllm_environment`; on a CPU also ``OMP_WAIT_POLICY=PASSIVE`` (unless ``base`` sets it): the
        server's front-end and the load generator share the host's cores with the engine, and OpenMP threads that
        spin at their barriers between steps take the time those need (on the 2-core host, TTFT p99 at 1-8 requests
        in flight 250-1,400 ms with spinning threads, 20-80 ms without, the p50s steadier run to run)."""
        options = cfg.get("engine_options") or {}
        on_cpu = str(cfg.get("device", "cpu")) == "cpu"
        env = vllm_environment(options, on_cpu, base)
        if on_cpu:
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return env

    def prompts(self, cfg: Mapping[str, Any], weights_path: str | None, base_url: str, lengths: list[int],
                seed: int) -> list[Any]:
        """Random ordinary token ids of the model's vocabulary (its special ids left out), one prompt per length."""
        _dir, _format, hf_config = _model(cfg, weights_path)
        vocab = int(hf_text_config(hf_config)["vocab_size"])
        rng = random.Random(seed)
        specials = sorted(special_token_ids(hf_config))
        return [random_token_ids(n_tokens, vocab, rng, specials) for n_tokens in lengths]

    def payload(self, prompt: Any, output_tokens: int) -> dict[str, Any]:
        return {"model": SERVED_NAME, "prompt": prompt, "max_tokens": output_tokens, "min_tokens": output_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0}


def _model(cfg: Mapping[str, Any], weights_path: str | None) -> tuple[Path, str, dict[str, Any]]:
    """The model directory vLLM serves, its load format and its config.json."""
    from harness.engines.vllm.child import resolve_model_dir

    model_dir, load_format = resolve_model_dir(cfg, weights_path)
    return model_dir, load_format, json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))


SERVER = VllmServer()
