"""llama.cpp through llama-cpp-python, driven token by token so every prompt and generated token is ours.

The engine runs in the child process. ``llama_cpp`` is imported inside ``load`` / ``version`` only, so the
parent can import this module (for ``memory_breakdown`` and the OOM patterns) without the library.

Measurement:
- a prompt is evaluated with ``Llama.eval`` after ``Llama.reset()`` plus an explicit KV-cache clear, so no
  prefix of an earlier prompt is reused;
- the next token is picked by llama.cpp's greedy sampler; end-of-sequence is fed back like any token;
- llama.cpp's own timers (``llama_perf_context``: ``t_p_eval_ms``, ``t_eval_ms``, ``n_p_eval``, ``n_eval``) are
  reset before and read after every measurement and reported beside the wall clock.

Memory lines (llama.cpp logs, printed to stderr when ``verbose=True``) are matched on their suffix because
the function-name prefix changes between versions: ``<buf> model buffer size = X MiB`` (older:
``llm_load_tensors: <buf> buffer size = X MiB``), ``<buf> KV buffer size = X MiB`` (older total:
``KV self size = X MiB``), ``<buf> compute buffer size = X MiB``, ``<buf> output buffer size = X MiB`` and
``offloaded N/M layers to GPU``. Sources: llama.cpp ``src/llama-model.cpp`` (``load_tensors``),
``src/llama-kv-cache.cpp``, ``src/llama-context.cpp``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from harness.engines.base import DecodeTiming, Engine, LoadInfo, PromptTiming
from predictor.errors import BenchcalError

MIB = 2**20

# llama.cpp commit vendored by each llama-cpp-python release (from llama-cpp-python's CHANGELOG.md:
# "feat: update llama.cpp to ggml-org/llama.cpp@<commit>").
VENDORED_LLAMA_CPP_COMMITS = {
    "0.3.36": "0c1e57098",
    "0.3.35": "4df29be4f",
}

# KV cache dtype name -> ggml type id (ggml.h ``enum ggml_type``).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

# llama.cpp's out-of-memory messages (src/llama-kv-cache.cpp, src/llama-context.cpp, src/llama-model.cpp,
# ggml/src/ggml-backend.cpp, ggml/src/ggml-alloc.c, ggml/src/ggml-cuda/ggml-cuda.cu).
LLAMA_OOM_PATTERNS = (
    r"cudaMalloc failed: out of memory",
    r"failed to allocate (?:\S+ )?buffer of size",
    r"unable to allocate \S+ buffer",
    r"failed to allocate buffer for (?:kv|rs) cache",
    r"failed to allocate compute (?:pp |tg )?buffers",
    r"failed to allocate output buffer",
    r"ggml\S*: .*out of memory",
)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_BUFFER_LINE = re.compile(
    r"(?P<buf>[A-Za-z][\w\[\]:.-]*)\s+(?P<kind>model |KV |compute |output |RS )?buffer size\s*=\s*"
    + _NUMBER + r"\s*(?P<unit>MiB|MB|GiB|KiB)"
)
_KV_SELF = re.compile(r"KV self size\s*=\s*" + _NUMBER + r"\s*(MiB|MB|GiB)", re.IGNORECASE)
_OLD_MEM_REQUIRED = re.compile(r"mem required\s*=\s*" + _NUMBER + r"\s*(MiB|MB)")
_OLD_COMPUTE_TOTAL = re.compile(r"compute buffer total size\s*=\s*" + _NUMBER + r"\s*(MiB|MB)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_MODEL_SECTION = re.compile(r"^\s*(?:llm_)?load_tensors:")
_UNIT_BYTES = {"KiB": 2**10, "MiB": MIB, "MB": MIB, "GiB": 2**30}  # llama.cpp's "MB" was bytes / 1024 / 1024
_DEVICE_BUFFER = re.compile(r"^(?:CUDA|ROCm|HIP|Vulkan|Metal|MTL|SYCL|MUSA|CANN|OpenCL)\d*$", re.IGNORECASE)


def _to_bytes(value: str, unit: str) -> int:
    return int(round(float(value) * _UNIT_BYTES[unit]))


def parse_memory_lines(log_text: str) -> dict[str, Any]:
    """Memory figures (bytes) from llama.cpp's log: weights, KV, compute and output buffers per buffer type.

    When a buffer is reported more than once (a context created again), the last report counts.
    ``device_bytes`` sums buffers on accelerators (``CUDA0``...), ``host_bytes`` the rest (``CPU``,
    ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA_Host``...). Keys are None when the log has no such line.
    """
    buffers: dict[str, dict[str, int]] = {"model": {}, "kv": {}, "compute": {}, "output": {}}
    raw_lines: list[str] = []
    kv_self_bytes = old_model_bytes = old_compute_bytes = None
    offloaded = total_layers = None
    for line in log_text.splitlines():
        match = _BUFFER_LINE.search(line)
        if match:
            kind = (match.group("kind") or "").strip()
            category = {"model": "model", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}.get(kind)
            if category is None and _MODEL_SECTION.match(line):
                category = "model"  # older llama.cpp: "llm_load_tensors:  CUDA0 buffer size = X MiB"
            if category is not None:
                buffers[category][match.group("buf")] = _to_bytes(match.group(3), match.group("unit"))
                raw_lines.append(line.strip())
            continue
        for pattern, slot in ((_KV_SELF, "kv"), (_OLD_MEM_REQUIRED, "model"), (_OLD_COMPUTE_TOTAL, "compute")):
            found = pattern.search(line)
            if found:
                value = _to_bytes(found.group(1), found.group(2))
                if slot == "kv":
                    kv_self_bytes = value
                elif slot == "model":
                    old_model_bytes = value
                else:
                    old_compute_bytes = value
                raw_lines.append(line.strip())
        found = _OFFLOADED.search(line)
        if found:
            offloaded, total_layers = int(found.group(1)), int(found.group(2))
            raw_lines.append(line.strip())
    return _summarize_buffers(buffers, kv_self_bytes, old_model_bytes, old_compute_bytes,
                              offloaded, total_layers, raw_lines)


def _summarize_buffers(
    buffers: dict[str, dict[str, int]],
    kv_self_bytes: int | None,
    old_model_bytes: int | None,
    old_compute_bytes: int | None,
    offloaded: int | None,
    total_layers: int | None,
    raw_lines: list[str],
) -> dict[str, Any]:
    def total(category: str, fallback: int | None) -> int | None:
        return sum(buffers[category].values()) if buffers[category] else fallback

    weights = total("model", old_model_bytes)
    kv = total("kv", kv_self_bytes)
    compute = total("compute", old_compute_bytes)
    output = total("output", None)
    parts = [p for p in (weights, kv, compute, output) if p is not None]
    device_bytes = sum(v for cat in buffers.values() for name, v in cat.items() if _DEVICE_BUFFER.match(name))
    host_bytes = sum(v for cat in buffers.values() for name, v in cat.items() if not _DEVICE_BUFFER.match(name))
    return {
        "weights_bytes": weights,
        "kv_bytes": kv,
        "compute_bytes": compute,
        "output_bytes": output,
        "total_bytes": sum(parts) if parts else None,
        "device_bytes": device_bytes if any(buffers.values()) else None,
        "host_bytes": host_bytes if any(buffers.values()) else None,
        "offloaded_layers": offloaded,
        "total_layers": total_layers,
        "buffers": {k: dict(v) for k, v in buffers.items() if v},
        "raw_lines": raw_lines,
    }


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
