"""llama.cpp through llama-cpp-python, driven token by token so every prompt and generated token is ours.

The engine runs in the child process. ``llama_cpp`` is imported inside ``load`` / ``version`` only, so the
parent can import this module (for ``memory_breakdown`` and the OOM patterns) without the library.

Measurement:
- a prompt is evaluated with ``Llama.eval`` after ``Llama.reset()`` plus an explicit KV-cache clear, so no
  prefix of an earlier prompt is reused;
- the next token is picked by llama.cpp's greedy sampler; end-of-sequence is fed back like any token;
- llama.cpp's own timers (``llama_perf_context``: ``t_p_eval_ms``, ``t_eval_ms``, ``n_p_eval``, ``n_eval``) are
  reset before and read after every measurement and reported beside the wall clock.

The log's parsers are in :mod:`harness.engines.llama_cpp.logparse`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from harness.engines.base import DecodeTiming, Engine, LoadInfo, PromptTiming
from harness.engines.llama_cpp.logparse import LLAMA_OOM_PATTERNS, parse_memory_lines
from predictor.errors import BenchcalError

# llama.cpp commit vendored by each llama-cpp-python release (from llama-cpp-python's CHANGELOG.md:
# "feat: update llama.cpp to ggml-org/llama.cpp@<commit>").
VENDORED_LLAMA_CPP_COMMITS = {
    "0.3.36": "0c1e57098",
    "0.3.35": "4df29be4f",
}

# KV cache dtype name -> ggml type id (ggml.h ``enum ggml_type``).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

def _perf(llama_cpp: Any, ctx: Any) -> Any:
    return llama_cpp.llama_perf_context(ctx)


class LlamaCppEngine(Engine):
    """llama.cpp via llama-cpp-python (``Llama`` object, low-level greedy sampler, perf counters)."""

    name: ClassVar[str] = "llama.cpp"
    oom_patterns: ClassVar[tuple[str, ...]] = LLAMA_OOM_PATTERNS

    def __init__(self) -> None:
        super().__init__()
        self._llama_cpp: Any = None
        self._llm: Any = None
        self._sampler: Any = None
        self.n_ctx = 0

    # ------------------------------------------------------------------------------------------ load
    def load(self, config: Mapping[str, Any], weights_path: str | None) -> LoadInfo:
        """Load ``weights_path`` (a .gguf) with the config's context, KV dtype and engine options."""
        import llama_cpp

        if not weights_path:
            raise BenchcalError("llama.cpp needs a GGUF file to load")
        if int(config.get("batch") or 1) != 1:
            raise BenchcalError("the llama.cpp engine measures batch 1 only")
        options = dict(config.get("engine_options") or {})
        kv_dtype = str(config.get("kv_dtype") or "f16").lower()
        if kv_dtype not in KV_TYPES:
            raise BenchcalError(f"llama.cpp KV dtype must be one of {', '.join(KV_TYPES)}, got {kv_dtype!r}")
        kwargs: dict[str, Any] = {
            "model_path": str(weights_path),
            "n_ctx": int(config["context"]),
            "n_gpu_layers": int(options.get("n_gpu_layers", 0) or 0),
            "flash_attn": bool(options.get("flash_attn", False)),
            "type_k": KV_TYPES[kv_dtype],
            "type_v": KV_TYPES[kv_dtype],
            "n_batch": int(options.get("n_batch") or 512),
            "n_ubatch": int(options.get("n_ubatch") or 512),
            "use_mmap": bool(options.get("use_mmap", True)),
            "verbose": True,
            "seed": int(options.get("seed", 0)),
        }
        if options.get("threads"):
            kwargs["n_threads"] = int(options["threads"])
            kwargs["n_threads_batch"] = int(options.get("threads_batch") or options["threads"])
        started = time.perf_counter()
        self._llm = llama_cpp.Llama(**kwargs)
        load_s = time.perf_counter() - started
        self._llama_cpp = llama_cpp
        self._sampler = llama_cpp.llama_sampler_init_greedy()
        self.vocab_size = int(self._llm.n_vocab())
        self.n_ctx = int(self._llm.n_ctx())
        self.special_token_ids = self._special_ids()
        return LoadInfo(
            load_s=load_s,
            vocab_size=self.vocab_size,
            n_ctx=self.n_ctx,
            total_layers=int(llama_cpp.llama_model_n_layer(self._llm.model)),
            offloaded_layers=None,
            extra={"model_size_bytes": int(llama_cpp.llama_model_size(self._llm.model)),
                   "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()},
        )

    def _special_ids(self) -> set[int]:
        """BOS, EOS, and every control / end-of-generation token id in the vocabulary's first 1024 ids."""
        llama_cpp, model = self._llama_cpp, self._llm.model
        vocab = llama_cpp.llama_model_get_vocab(model)
        ids = {int(self._llm.token_bos()), int(self._llm.token_eos())}
        for token in range(min(self.vocab_size, 1024)):
            if llama_cpp.llama_vocab_is_control(vocab, token) or llama_cpp.llama_vocab_is_eog(vocab, token):
                ids.add(token)
        return {i for i in ids if 0 <= i < self.vocab_size}

    # ------------------------------------------------------------------------------------- measuring
    def _fresh(self) -> None:
        """Forget every earlier token: Python-side state and the whole KV cache; reset the perf timers."""
        llm, llama_cpp = self._llm, self._llama_cpp
        llm.reset()
        memory = llama_cpp.llama_get_memory(llm.ctx)
        if memory is not None:
            llama_cpp.llama_memory_clear(memory, True)
        llama_cpp.llama_perf_context_reset(llm.ctx)

    def _next_token(self) -> int:
        return int(self._llama_cpp.llama_sampler_sample(self._sampler, self._llm.ctx, -1))

    def _check_room(self, n_tokens: int) -> None:
        if n_tokens > self.n_ctx:
            raise BenchcalError(f"{n_tokens} tokens do not fit the context of {self.n_ctx}")

    def measure_prompt(self, prompt_token_ids: Sequence[int]) -> PromptTiming:
        """Evaluate the prompt from an empty cache, then pick the first token (TTFT)."""
        self._check_room(len(prompt_token_ids) + 1)
        self._fresh()
        submit = time.perf_counter()
        self._llm.eval(list(prompt_token_ids))
        evaluated = time.perf_counter()
        self._next_token()
        first = time.perf_counter()
        perf = _perf(self._llama_cpp, self._llm.ctx)
        return PromptTiming(
            prompt_tokens=len(prompt_token_ids),
            ttft_s=first - submit,
            prefill_s=evaluated - submit,
            engine_prefill_s=perf.t_p_eval_ms / 1000.0 if perf.n_p_eval else None,
            engine_prompt_tokens=int(perf.n_p_eval),
        )

    def measure_decode(self, prompt_token_ids: Sequence[int], n_gen: int) -> DecodeTiming:
        """Evaluate the prompt, then generate exactly ``n_gen`` tokens one by one (EOS ignored)."""
        self._check_room(len(prompt_token_ids) + n_gen)
        self._fresh()
        submit = time.perf_counter()
        self._llm.eval(list(prompt_token_ids))
        token = self._next_token()
        times = [time.perf_counter()]
        llama_cpp = self._llama_cpp
        llama_cpp.llama_perf_context_reset(self._llm.ctx)  # the decode timer covers tokens 2..n_gen only
        for _ in range(n_gen - 1):
            self._llm.eval([token])
            token = self._next_token()
            times.append(time.perf_counter())
        perf = _perf(llama_cpp, self._llm.ctx)
        return DecodeTiming(
            context_at_start=len(prompt_token_ids),
            submit_s=submit,
            token_times_s=times,
            engine_decode_s=perf.t_eval_ms / 1000.0 if perf.n_eval else None,
            engine_decode_tokens=int(perf.n_eval),
        )

    # ------------------------------------------------------------------------------------ reporting
    @classmethod
    def memory_breakdown(cls, log_text: str) -> dict[str, Any]:
        """llama.cpp's buffer report parsed from its log (see :func:`parse_memory_lines`)."""
        return parse_memory_lines(log_text)

    @classmethod
    def version(cls) -> dict[str, Any]:
        """llama-cpp-python version, libllama version, vendored llama.cpp commit, and build (cpu/cuda/...)."""
        try:
            import llama_cpp
        except ImportError:
            return {"engine_version": None, "engine_commit": None, "engine_build": None}
        package = getattr(llama_cpp, "__version__", None)
        try:
            library = llama_cpp.llama_version().decode()
        except (AttributeError, OSError):
            library = None
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        return {
            "engine_version": f"llama-cpp-python {package}" + (f" (libllama {library})" if library else ""),
            "engine_commit": VENDORED_LLAMA_CPP_COMMITS.get(str(package)),
            "engine_build": build_kind(info, bool(llama_cpp.llama_supports_gpu_offload())),
            "system_info": info.strip(),
        }

    def close(self) -> None:
        if self._sampler is not None:
            self._llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None


def build_kind(system_info: str, gpu_offload: bool) -> str:
    """``cuda``, ``rocm``, ``metal``, ``vulkan``, ``sycl``, ``gpu`` (other offload) or ``cpu``."""
    for marker, kind in (("CUDA", "cuda"), ("ROCm", "rocm"), ("HIP", "rocm"), ("Metal", "metal"),
                         ("MTL", "metal"), ("Vulkan", "vulkan"), ("SYCL", "sycl")):
        if marker in system_info:
            return kind
    return "gpu" if gpu_offload else "cpu"
