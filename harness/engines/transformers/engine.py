"""PyTorch + Hugging Face transformers, as a reference engine where neither llama.cpp nor vLLM can run.

The model is built from the catalogue's ``config.json`` fields with random weights
(``AutoModelForCausalLM.from_config``, created directly on the device), or loaded from a local Hugging Face
folder given as the weights path. Speed and memory depend on shapes and dtypes, not on values, so a
random-weight model measures like the real one in this engine. Weights are unquantized: ``BF16`` (default
on GPUs), ``F16`` or ``F32`` (default on CPUs); the KV cache has the model's dtype.

Measurement, token by token with greedy picks so every prompt and generated token is ours:
- a prompt runs through one forward pass with a fresh cache (no reuse of an earlier prompt), keeping
  only the last position's logits; the pick of its argmax is the first token (TTFT);
- decode feeds each picked token back with the cache; end-of-sequence is ignored;
- on CUDA, events around the prompt's forward pass and around the decode loop are the engine's own timers
  (GPU time), reported beside the wall clock.

Memory: the engine prints ``benchcal transformers: key=value ...`` lines (weights, CUDA allocator
figures, KV cache bytes) that :meth:`TransformersEngine.memory_breakdown` parses from the child's log.
``torch`` and ``transformers`` are imported inside ``load`` / ``version`` only.
"""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from harness.engines.base import DecodeTiming, Engine, LoadInfo, PromptTiming
from harness.engines.transformers.logparse import TORCH_OOM_PATTERNS, parse_memory_lines
from predictor.errors import BenchcalError

# Weight format -> torch dtype name. None: bfloat16 on a GPU, float32 on a CPU.
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def hf_config_dict(model_id: str, overrides: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The catalogue's Hugging Face config for ``model_id`` (text part), with synthetic overrides applied."""
    from harness.synthetic import catalogue_entry
    from predictor.models import resolve_model

    arch = resolve_model(model_id)
    entry = catalogue_entry(arch.id)
    if not entry or not entry.get("config"):
        raise BenchcalError(f"{model_id}: the catalogue has no config.json fields to build it from")
    from harness.synthetic import apply_config_overrides

    config = apply_config_overrides(entry["config"], overrides)
    if isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    if not config.get("model_type"):
        raise BenchcalError(f"{model_id}: its config has no model_type")
    return config


def torch_dtype_name(quant: str | None, on_gpu: bool) -> str:
    """The torch dtype for a weight format; BenchcalError for a quantized one."""
    if not quant:
        return "bfloat16" if on_gpu else "float32"
    name = str(quant).upper()
    if name not in DTYPES:
        raise BenchcalError(f"the transformers engine runs unquantized weights ({', '.join(DTYPES)}), not {quant!r}")
    return DTYPES[name]


def cache_bytes(cache: Any) -> int | None:
    """Bytes held by a transformers KV cache (``DynamicCache`` of transformers 4.x or 5.x); None if unknown."""
    tensors: list[Any] = []
    for layer in getattr(cache, "layers", None) or []:
        tensors += [getattr(layer, "keys", None), getattr(layer, "values", None)]
    tensors += list(getattr(cache, "key_cache", None) or []) + list(getattr(cache, "value_cache", None) or [])
    sizes = [t.numel() * t.element_size() for t in tensors if hasattr(t, "numel") and hasattr(t, "element_size")]
    return int(sum(sizes)) if sizes else None


class TransformersEngine(Engine):
    """A causal LM from transformers on one device, greedy, token by token."""

    name: ClassVar[str] = "transformers"
    oom_patterns: ClassVar[tuple[str, ...]] = TORCH_OOM_PATTERNS

    def __init__(self) -> None:
        super().__init__()
        self._torch: Any = None
        self._model: Any = None
        self._device: Any = None
        self._logits_arg: str | None = None
        self.n_ctx = 0

    # ------------------------------------------------------------------------------------------ load
    def load(self, config: Mapping[str, Any], weights_path: str | None) -> LoadInfo:
        """Build the model (random weights from the catalogue config, or a local HF folder) on the device."""
        import torch
        import transformers

        if int(config.get("batch") or 1) != 1:
            raise BenchcalError("the transformers engine measures batch 1 only")
        options = dict(config.get("engine_options") or {})
        on_gpu = str(config.get("device") or "cpu") != "cpu"
        if on_gpu and not torch.cuda.is_available():
            raise BenchcalError("the transformers engine was asked for a GPU but torch sees no CUDA device")
        self._torch = torch
        self._device = torch.device(f"cuda:{int(options.get('gpu_index', 0))}" if on_gpu else "cpu")
        dtype = getattr(torch, torch_dtype_name(config.get("quant"), on_gpu))
        attention = str(options.get("attn_implementation") or "sdpa")
        started = time.perf_counter()
        if weights_path and Path(weights_path).is_dir():
            self._model = _from_pretrained(transformers, weights_path, dtype, attention, self._device)
            hf_config = self._model.config
        else:
            hf_dict = hf_config_dict(str(config["model"]), config.get("arch_overrides"))
            hf_dict.pop("architectures", None)
            hf_dict.pop("torch_dtype", None)
            hf_config = transformers.AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict)
            with torch.device(self._device):
                self._model = _from_config(transformers, hf_config, dtype, attention)
        self._model.eval()
        self._sync()
        load_s = time.perf_counter() - started
        self._logits_arg = _logits_argument(self._model)
        self.vocab_size = int(hf_config.vocab_size)
        self.n_ctx = int(config["context"])
        self.special_token_ids = _special_ids(hf_config, self.vocab_size)
        weights_bytes = sum(p.numel() * p.element_size() for p in self._model.parameters())
        self._report(weights_bytes=weights_bytes, **self._allocator())
        return LoadInfo(
            load_s=load_s, vocab_size=self.vocab_size, n_ctx=self.n_ctx,
            total_layers=int(getattr(hf_config, "num_hidden_layers", 0) or 0) or None,
            offloaded_layers=None,
            extra={"weights_bytes": int(weights_bytes), "dtype": str(dtype).removeprefix("torch."),
                   "attn_implementation": attention, "device": str(self._device),
                   "parameters": int(sum(p.numel() for p in self._model.parameters())),
                   "random_weights": not (weights_path and Path(weights_path).is_dir())},
        )

    # ------------------------------------------------------------------------------------- measuring
    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)

    def _event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True) if self._device.type == "cuda" else None

    def _allocator(self) -> dict[str, int]:
        if self._device is None or self._device.type != "cuda":
            return {}
        cuda = self._torch.cuda
        return {"allocated_bytes": int(cuda.memory_allocated(self._device)),
                "reserved_bytes": int(cuda.memory_reserved(self._device)),
                "peak_allocated_bytes": int(cuda.max_memory_allocated(self._device))}

    def _report(self, **figures: int | None) -> None:
        """One memory line on stdout, parsed back from the log by :meth:`memory_breakdown`."""
        text = " ".join(f"{k}={int(v)}" for k, v in figures.items() if v is not None)
        if text:
            print(f"benchcal transformers: {text}", flush=True)

    def _forward(self, token_ids: Sequence[int], cache: Any) -> tuple[int, Any]:
        """One forward pass over ``token_ids`` after ``cache``; returns the greedy next token and the cache."""
        torch = self._torch
        kwargs: dict[str, Any] = {"use_cache": True}
        if cache is not None:
            kwargs["past_key_values"] = cache
        if self._logits_arg:
            kwargs[self._logits_arg] = 1
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            output = self._model(input_ids=ids, **kwargs)
        return int(output.logits[0, -1].argmax().item()), output.past_key_values

    def _check_room(self, n_tokens: int) -> None:
        if n_tokens > self.n_ctx:
            raise BenchcalError(f"{n_tokens} tokens do not fit the context of {self.n_ctx}")

    def measure_prompt(self, prompt_token_ids: Sequence[int]) -> PromptTiming:
        """A fresh prompt through one forward pass, then the greedy pick of its first token."""
        self._check_room(len(prompt_token_ids) + 1)
        torch = self._torch
        ids = torch.tensor([list(prompt_token_ids)], dtype=torch.long, device=self._device)
        kwargs: dict[str, Any] = {"use_cache": True, **({self._logits_arg: 1} if self._logits_arg else {})}
        start_event, end_event = self._event(), self._event()
        self._sync()
        submit = time.perf_counter()
        with torch.inference_mode():
            if start_event is not None:
                start_event.record()
            output = self._model(input_ids=ids, **kwargs)
            if end_event is not None:
                end_event.record()
            self._sync()
            evaluated = time.perf_counter()
            int(output.logits[0, -1].argmax().item())
        first = time.perf_counter()
        engine_s = start_event.elapsed_time(end_event) / 1000.0 if start_event is not None else None
        return PromptTiming(prompt_tokens=len(prompt_token_ids), ttft_s=first - submit, prefill_s=evaluated - submit,
                            engine_prefill_s=engine_s, engine_prompt_tokens=len(prompt_token_ids) if engine_s else None)

    def measure_decode(self, prompt_token_ids: Sequence[int], n_gen: int) -> DecodeTiming:
        """A fresh prompt, then exactly ``n_gen`` greedy tokens fed back one by one (EOS ignored)."""
        self._check_room(len(prompt_token_ids) + n_gen)
        self._sync()
        submit = time.perf_counter()
        token, cache = self._forward(prompt_token_ids, None)
        times = [time.perf_counter()]
        start_event, end_event = self._event(), self._event()
        if start_event is not None:
            start_event.record()
        for _ in range(n_gen - 1):
            token, cache = self._forward([token], cache)
            times.append(time.perf_counter())
        if end_event is not None:
            end_event.record()
            self._sync()
        engine_s = start_event.elapsed_time(end_event) / 1000.0 if start_event is not None and n_gen > 1 else None
        kv_bytes = cache_bytes(cache)
        self._report(kv_cache_bytes=kv_bytes, kv_tokens=len(prompt_token_ids) + n_gen - 1, **self._allocator())
        return DecodeTiming(context_at_start=len(prompt_token_ids), submit_s=submit, token_times_s=times,
                            engine_decode_s=engine_s, engine_decode_tokens=(n_gen - 1) if engine_s else None,
                            extra={"kv_cache_bytes": kv_bytes})

    # ------------------------------------------------------------------------------------ reporting
    @classmethod
    def memory_breakdown(cls, log_text: str) -> dict[str, Any]:
        """Weights, CUDA allocator and KV cache figures (bytes) the engine printed to its log."""
        figures = parse_memory_lines(log_text)
        if not figures:
            return {}
        return {"weights_bytes": figures.get("weights_bytes"), "kv_bytes": figures.get("kv_cache_bytes"),
                "allocated_bytes": figures.get("allocated_bytes"), "reserved_bytes": figures.get("reserved_bytes"),
                "peak_allocated_bytes": figures.get("peak_allocated_bytes"), "kv_tokens": figures.get("kv_tokens"),
                "source": "parameter sizes, KV cache tensors, torch.cuda allocator (GPU only)"}

    @classmethod
    def version(cls) -> dict[str, Any]:
        """transformers and torch versions; build ``cuda <version>`` or ``cpu``."""
        try:
            import torch
            import transformers
        except ImportError:
            return {"engine_version": None, "engine_commit": None, "engine_build": None}
        cuda = torch.version.cuda if torch.cuda.is_available() else None
        return {"engine_version": f"transformers {transformers.__version__} (torch {torch.__version__})",
                "engine_commit": None, "engine_build": f"cuda {cuda}" if cuda else "cpu"}

    def close(self) -> None:
        if self._model is None:
            return
        self._report(**self._allocator())
        self._model = None
        gc.collect()
        if self._device is not None and self._device.type == "cuda":
            self._torch.cuda.empty_cache()


def _from_config(transformers: Any, hf_config: Any, dtype: Any, attention: str) -> Any:
    """``AutoModelForCausalLM.from_config`` with ``dtype`` (transformers 5) or ``torch_dtype`` (4.x)."""
    auto = transformers.AutoModelForCausalLM
    try:
        return auto.from_config(hf_config, dtype=dtype, attn_implementation=attention)
    except TypeError:
        return auto.from_config(hf_config, torch_dtype=dtype, attn_implementation=attention)


def _from_pretrained(transformers: Any, path: str, dtype: Any, attention: str, device: Any) -> Any:
    auto = transformers.AutoModelForCausalLM
    try:
        model = auto.from_pretrained(path, dtype=dtype, attn_implementation=attention, trust_remote_code=False)
    except TypeError:
        model = auto.from_pretrained(path, torch_dtype=dtype, attn_implementation=attention, trust_remote_code=False)
    return model.to(device)


def _logits_argument(model: Any) -> str | None:
    """The forward argument that keeps only the last position's logits, if this transformers has one."""
    parameters = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in parameters:
            return name
    return None


def _special_ids(hf_config: Any, vocab_size: int) -> set[int]:
    ids: set[int] = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(hf_config, key, None)
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and 0 <= item < vocab_size:
                ids.add(item)
    return ids
