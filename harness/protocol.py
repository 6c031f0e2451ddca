"""One configuration end to end: plan with the predictor, prepare weights, measure in a child, store the record.

:func:`run_config` is the whole protocol:

1. normalize the config and check it (prompt + generated tokens must fit the context);
2. plan: ask the predictor (``predictor.estimate.predict``) for the same config; if it says the config
   does not fit the device, say so and measure the recommended one instead (llama.cpp: the most layers on
   the GPU that fit), keeping the original under ``planned``;
3. weights: a cached synthetic GGUF (llama.cpp) or config-only HF directory (vLLM), a user's file or
   directory, or a hub download;
4. measure in a child process (:func:`harness.engines.runner.run_engine`);
5. build the record (samples and summaries, memory, prediction, provenance) and write it atomically.
   An OOM the prediction said fits, or an ok run it said does not fit, is flagged as ``prediction_error``.

Ctrl-C or SIGTERM during a run: the engine is killed, the record is written with status ``interrupted``,
then :class:`Interrupted` (a KeyboardInterrupt) is raised so sweeps stop.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import records
from harness.engines.runner import DEFAULT_DECODE_PROMPT_TOKENS, run_engine
from harness.measurements import build_measurements
from harness.provenance import base_provenance
from predictor.errors import BenchcalError

DEFAULT_TIMEOUT_S = 900.0
FIT_VERDICTS_OK = ("fits", "tight")


class Interrupted(KeyboardInterrupt):
    """The user stopped a run; its record (status ``interrupted``) is at ``path``."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(str(path) if path else "")
        self.path = path


@dataclass
class Plan:
    """What will be measured and what the predictor said about it."""

    config: dict[str, Any]
    prediction: dict[str, Any] | None
    prediction_reason: str | None = None
    planned: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str | None:
        return ((self.prediction or {}).get("fit") or {}).get("verdict")


@dataclass
class RunOutcome:
    """A stored run: its record and where it is."""

    record: dict[str, Any]
    path: Path
    plan: Plan


# ------------------------------------------------------------------------------------------------ config


def prepare_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize ``config`` and check what a user can get wrong; BenchcalError with one line otherwise."""
    cfg = records.normalize_config(config)
    if not cfg.get("model"):
        raise BenchcalError("a run needs a model")
    if cfg["engine"] not in records.ENGINES:
        raise BenchcalError(f"unknown engine {cfg['engine']!r} (choose from: {', '.join(records.ENGINES)})")
    for key in ("context", "reps", "batch", "device_count"):
        if int(cfg[key]) <= 0:
            raise BenchcalError(f"{key} must be positive, got {cfg[key]!r}")
    if int(cfg["warmup"]) < 0 or int(cfg["gen_tokens"]) < 0:
        raise BenchcalError("warmup and gen_tokens must be zero or positive")
    longest = max(cfg["prompt_tokens"] or [0])
    if min(cfg["prompt_tokens"] or [1]) <= 0:
        raise BenchcalError("prompt lengths must be positive")
    if longest + 1 > cfg["context"]:
        raise BenchcalError(f"a {longest}-token prompt does not fit a context of {cfg['context']} tokens")
    decode_context = min(cfg["prompt_tokens"] or [16])
    if decode_context + cfg["gen_tokens"] > cfg["context"]:
        raise BenchcalError(f"{decode_context} prompt + {cfg['gen_tokens']} generated tokens exceed the "
                            f"context of {cfg['context']}")
    if cfg["engine"] == "llama.cpp":
        _llama_defaults(cfg)
    elif cfg["engine"] == "vllm":
        _vllm_defaults(cfg)
    return cfg


def _gguf_path(cfg: Mapping[str, Any]) -> Path | None:
    weights = str(cfg.get("weights") or "synthetic")
    path = Path(weights).expanduser()
    return path if weights not in ("synthetic", "hub") and path.suffix.lower() == ".gguf" else None


def _llama_defaults(cfg: dict[str, Any]) -> None:
    """llama.cpp options: GPU layers in step with ``offload_fraction``, the GGUF's own quant, threads."""
    options = cfg["engine_options"]
    gguf = _gguf_path(cfg)
    if gguf is not None and not cfg.get("quant") and gguf.is_file():
        from predictor.models import resolve_model

        cfg["quant"] = resolve_model(str(gguf)).weights_quant
    if cfg["device"] == "cpu":
        options.setdefault("n_gpu_layers", 0)
    else:
        fraction = float(cfg.get("offload_fraction") or 0.0)
        explicit = options.get("n_gpu_layers")
        if explicit is None and fraction > 0:
            options["n_gpu_layers"] = int(round((1.0 - fraction) * _model_arch(cfg).num_layers))
        elif explicit is None:
            options["n_gpu_layers"] = -1
        elif int(explicit) >= 0 and fraction == 0:
            layers = _model_arch(cfg).num_layers
            cfg["offload_fraction"] = round(1.0 - min(int(explicit), layers) / layers, 4)
    options.setdefault("flash_attn", False)
    options.setdefault("n_batch", 512)
    options.setdefault("n_ubatch", 512)
    if cfg["device"] == "cpu":
        options.setdefault("threads", default_threads())


def _vllm_defaults(cfg: dict[str, Any]) -> None:
    """vLLM options (KV pool, graphs, memory utilization) and the KV dtype the cache will really hold.

    vLLM's ``kv_cache_dtype="auto"`` stores the cache in the model's dtype, so an f16/bf16/auto request is
    recorded as that dtype (bf16 for a BF16 model); fp8 kinds are kept as asked.
    """
    from harness.engines.vllm import default_engine_options, kv_cache_dtype
    from harness.engines.vllm_child import QUANT_SETTINGS

    cfg["engine_options"] = default_engine_options(cfg)
    kv_pool = cfg["engine_options"]["kv_pool"]
    if kv_pool not in ("pinned", "profiled"):
        raise BenchcalError(f"engine option kv_pool must be 'pinned' or 'profiled', got {kv_pool!r}")
    quant = str(cfg.get("quant") or "auto").lower()
    if str(cfg.get("weights") or "synthetic") == "synthetic" and quant not in QUANT_SETTINGS:
        raise BenchcalError(f"quant {cfg['quant']!r} cannot be made synthetic for vLLM "
                            f"(supported: {', '.join(sorted(QUANT_SETTINGS))})")
    if kv_cache_dtype(cfg.get("kv_dtype")) == "auto":
        cfg["kv_dtype"] = _vllm_model_dtype(cfg) or str(cfg.get("kv_dtype") or "auto").lower()


# quant or vLLM dtype -> the dtype it names (other quants run in the checkpoint's torch_dtype).
_VLLM_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "fp16": "f16", "float16": "f16", "half": "f16",
                "f32": "f32", "fp32": "f32", "float32": "f32"}


def _vllm_model_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The model dtype vLLM will run in: engine option ``dtype``, the quant, else the config's torch_dtype."""
    for name in ((cfg.get("engine_options") or {}).get("dtype"), cfg.get("quant")):
        if name and str(name).lower() in _VLLM_DTYPES:
            return _VLLM_DTYPES[str(name).lower()]
    hf_config = _vllm_hf_config(cfg) or {}
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else {}
    for source in (hf_config, text):
        name = source.get("torch_dtype") or source.get("dtype")
        if isinstance(name, str) and name.lower() in _VLLM_DTYPES:
            return _VLLM_DTYPES[name.lower()]
    return None


def _vllm_hf_config(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The HF config vLLM will load: a directory's config.json, the synthetic model's config, else None."""
    import json

    weights = str(cfg.get("weights") or "synthetic")
    if weights == "synthetic":
        from harness.synthetic_hf import base_config

        try:
            return base_config(str(cfg["model"]))
        except BenchcalError:
            return None  # prepare_weights says why
    path = Path(weights).expanduser() / "config.json"
    if weights != "hub" and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return None


def _vllm_synthetic_overrides(cfg: Mapping[str, Any]) -> dict[str, int] | None:
    """Shrink overrides of a synthetic vLLM model: ``arch_overrides``, else engine option synthetic_overrides."""
    for value in (cfg.get("arch_overrides"), (cfg.get("engine_options") or {}).get("synthetic_overrides")):
        if isinstance(value, Mapping) and value:
            return {str(k): int(v) for k, v in value.items()}
    return None


def default_threads() -> int:
    """CPU threads for llama.cpp: the physical cores, leaving one hardware thread to the harness's sampler.

    With SMT the sibling threads are free already; without it one core is left out (ggml's spinning thread
    barrier slows down many times over when any of its threads is preempted).
    """
    import psutil

    from harness.hostbench import usable_cores

    logical = usable_cores()
    physical = int(psutil.cpu_count(logical=False) or logical)
    physical = min(physical, logical)
    return physical if logical > physical else max(1, physical - 1)


# -------------------------------------------------------------------------------------------------- plan


def _model_arch(cfg: Mapping[str, Any]) -> Any:
    from harness import synthetic

    gguf = _gguf_path(cfg)
    if gguf is not None and gguf.is_file():
        from predictor.models import resolve_model

        return resolve_model(str(gguf))
    arch = synthetic.resolve_arch(cfg["model"], cfg.get("arch_overrides"))
    quant = cfg.get("quant")
    if cfg.get("weights") == "synthetic" and cfg["engine"] == "llama.cpp" and quant in synthetic.FILE_TYPES:
        # the synthetic GGUF's tensor types follow llama-quantize (output or tied embeddings in Q6_K, ...):
        # predict with its exact size, as for any GGUF file, not the catalogue's whole-file average width
        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        arch = dataclasses.replace(arch, weights_bytes_exact=synthetic.weights_bytes(spec, quant), weights_quant=quant)
    return arch


def _predictor_device(cfg: Mapping[str, Any], host: Mapping[str, Any] | None) -> Any:
    """The predictor's device for the run: the catalogue GPU, or the host CPU with its probed figures and its
    calibration identity (``host_id``)."""
    from harness.hostbench import host_cpu_device
    from predictor import devices

    if cfg["device"] != "cpu":
        return devices.resolve_device(cfg["device"])
    # a calibrated host is predicted with the figures its coefficients were fitted against
    return host_cpu_device(str(cfg["engine"]), host)


def predict_config(cfg: Mapping[str, Any], host: Mapping[str, Any] | None = None) -> tuple[dict | None, str | None]:
    """The predictor's ``Estimate.to_dict()`` for ``cfg``, or ``(None, reason)`` when it cannot say."""
    try:
        from predictor.estimate import predict
    except ImportError as exc:
        return None, f"predictor unavailable: {exc}"
    options = cfg.get("engine_options") or {}
    prompts = list(cfg["prompt_tokens"] or [])

    def estimate_at(arch: Any, device: Any, prompt_tokens: int, launch: bool = True) -> dict:
        return predict(
            arch, device, quant=cfg.get("quant"), context=int(cfg["context"]),
            engine=cfg["engine"], prompt_tokens=prompt_tokens, batch=int(cfg["batch"]),
            kv_dtype=cfg.get("kv_dtype"), device_count=int(cfg["device_count"]),
            offload_fraction=float(cfg.get("offload_fraction") or 0.0),
            flash_attn=bool(options.get("flash_attn", False)), n_ubatch=int(options.get("n_ubatch") or 512),
            host_bandwidth_gbs=(host or {}).get("bandwidth_gbs"), host_memory_gib=(host or {}).get("memory_gib"),
            enforce_eager=bool(options.get("enforce_eager", False)), launch=launch,
        ).to_dict()

    try:
        # TTFT and prefill for the longest prompt; decode where the harness measures it: after the shortest
        # prompt, halfway through the generated tokens.
        arch, device = _model_arch(cfg), _predictor_device(cfg, host)
        prediction = estimate_at(arch, device, max(prompts or [512]))
        decode_at = min(prompts or [DEFAULT_DECODE_PROMPT_TOKENS]) + int(cfg.get("gen_tokens") or 0) // 2
        decode = estimate_at(arch, device, max(decode_at, 1), launch=False)["throughput"]
        for key in ("decode_tok_s", "decode_tok_s_total", "decode_context", "cost_per_1m_output_usd"):
            if key in decode:
                prediction["throughput"][key] = decode[key]
        return prediction, None
    except BenchcalError as exc:
        return None, f"predictor declined: {exc}"
    except Exception as exc:  # the measurement must not depend on the predictor working
        return None, f"predictor failed: {type(exc).__name__}: {exc}"


def plan_config(cfg: dict[str, Any], host: Mapping[str, Any] | None = None) -> Plan:
    """Predict ``cfg``; replace a llama.cpp GPU config that does not fit by the most GPU layers that fit."""
    prediction, reason = predict_config(cfg, host)
    plan = Plan(cfg, prediction, reason)
    if prediction is None or plan.verdict not in ("needs offload", "does not fit"):
        return plan
    if cfg["engine"] != "llama.cpp" or cfg["device"] == "cpu":
        plan.messages.append(f"predicted {plan.verdict} on {cfg['device']}; measuring anyway")
        return plan
    layers = int((prediction.get("fit") or {}).get("max_gpu_layers") or 0)
    total_layers = int((prediction.get("model") or {}).get("layers") or 0)
    replaced = copy.deepcopy(cfg)
    replaced["engine_options"]["n_gpu_layers"] = max(layers, 0)
    if total_layers:
        replaced["offload_fraction"] = round(1.0 - min(layers, total_layers) / total_layers, 4)
    new_prediction, new_reason = predict_config(replaced, host)
    planned = {"config": cfg, "config_hash": records.config_hash(cfg), "verdict": plan.verdict,
               "reason": f"predicted {plan.verdict} on {cfg['device']}; measuring {layers} GPU layers instead"}
    message = f"{cfg['model']} {cfg.get('quant')} ctx {cfg['context']}: {planned['reason']}"
    return Plan(replaced, new_prediction, new_reason, planned, [message])


# ----------------------------------------------------------------------------------------------- weights


def prepare_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Path of the weights to load and facts about them (for provenance)."""
    weights = str(cfg.get("weights") or "synthetic")
    if weights == "synthetic":
        if cfg["engine"] == "vllm":
            return _vllm_synthetic_weights(cfg)
        if cfg["engine"] != "llama.cpp":
            return None, {"weights_kind": "synthetic"}
        from harness import synthetic

        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        quant = synthetic.normalize_file_type(cfg.get("quant") or "Q4_K_M")
        path = synthetic.synthetic_gguf(cfg["model"], quant, cfg.get("arch_overrides"))
        return str(path), {"weights_kind": "synthetic", "weights_file": str(path),
                           "weights_bytes": synthetic.weights_bytes(spec, quant),
                           "synthetic_layout": spec["gguf_arch"], "synthetic_exact_layout": spec["exact_layout"]}
    if weights == "hub":
        return _hub_weights(cfg)
    path = Path(weights).expanduser()
    if not path.exists():
        raise BenchcalError(f"weights file {weights} does not exist")
    return str(path), {"weights_kind": "path", "weights_file": str(path), "weights_bytes": _size(path)}


def _vllm_synthetic_weights(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cached config-only HF directory vLLM loads with random weights (``load_format="dummy"``)."""
    import json

    from harness.synthetic_hf import synthetic_hf_dir

    folder = synthetic_hf_dir(str(cfg["model"]), _vllm_synthetic_overrides(cfg))
    hf_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return str(folder), {"weights_kind": "synthetic", "weights_file": str(folder), "weights_load_format": "dummy",
                         "synthetic_layout": (hf_config.get("architectures") or [None])[0]}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hub_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Download the model's weights from the Hugging Face hub (GGUF for llama.cpp)."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise BenchcalError("--weights hub needs huggingface_hub (pip install huggingface_hub)") from exc
    from predictor.models import resolve_model

    arch = resolve_model(cfg["model"])
    repo = cfg.get("engine_options", {}).get("hub_repo") or arch.hf_id
    if not repo:
        raise BenchcalError(f"{cfg['model']} has no Hugging Face id; pass --weights PATH")
    try:
        if cfg["engine"] == "llama.cpp":
            filename = cfg.get("engine_options", {}).get("hub_file")
            if not filename:
                raise BenchcalError("--weights hub with llama.cpp needs engine option hub_repo and hub_file "
                                    "(a GGUF repository and file name)")
            path = huggingface_hub.hf_hub_download(repo, filename)
        else:
            path = huggingface_hub.snapshot_download(repo)
    except BenchcalError:
        raise
    except Exception as exc:
        raise BenchcalError(f"could not download {repo} from the hub ({type(exc).__name__}); "
                            "no network? pass --weights PATH") from exc
    return path, {"weights_kind": "hub", "weights_file": path, "hub_repo": repo}


def prediction_error(status: str, verdict: str | None) -> dict[str, Any] | None:
    """Flag a run whose outcome contradicts the fit verdict (OOM predicted to fit, ok predicted not to fit as
    configured: the stored prediction is for the configuration measured, offload included)."""
    if status == "oom" and verdict == "fits":
        return {"kind": "oom_predicted_fits", "verdict": verdict, "status": status}
    if status == "ok" and verdict in ("does not fit", "needs offload"):
        return {"kind": "ok_predicted_not_fit", "verdict": verdict, "status": status}
    return None


# ------------------------------------------------------------------------------------------------- run


def log_path_for(cfg: Mapping[str, Any]) -> Path:
    """Where the child's log goes: ``$BENCHCAL_CACHE/logs/<time>-<hash10>.log``."""
    from harness.synthetic import cache_dir

    stamp = records.new_record_id(records.config_hash(cfg))
    return cache_dir() / "logs" / f"{stamp}.log"


def gpu_index(cfg: Mapping[str, Any]) -> int | None:
    """The NVML index to watch for ``cfg`` (None on CPU)."""
    if cfg["device"] == "cpu":
        return None
    return int((cfg.get("engine_options") or {}).get("gpu_index", 0))


def run_config(
    config: Mapping[str, Any],
    runs_dir: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] | None = None,
    host: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """Plan, measure and store one config; returns the record and its path (raises :class:`Interrupted`)."""
    from harness.hostbench import host_profile
    from harness.samplers import gpu_snapshot

    cfg = prepare_config(config)
    root = records.runs_dir(runs_dir)
    host = dict(host or host_profile())
    plan = plan_config(cfg, host)
    for message in plan.messages:
        (say or print)(message)
    cfg = plan.config
    index = gpu_index(cfg)
    gpu = gpu_snapshot(index) if index is not None else None
    provenance = base_provenance(cfg, host, gpu)
    weights_path, weights_info = prepare_weights(cfg)
    provenance.update(weights_info)
    log_path = log_path_for(cfg)
    run = run_engine(cfg, weights_path, log_path, timeout_s=float(timeout_s or cfg.get("timeout_s") or DEFAULT_TIMEOUT_S),
                     device_index=index, on_event=on_event)
    if run.memory.get("foreign_processes"):
        names = ", ".join(f"{p.get('name') or '?'} (pid {p['pid']})" for p in run.memory["foreign_processes"])
        (say or print)(f"warning: other processes used the GPU during the run: {names}; its memory reading "
                       "may include theirs")
    provenance.update({k: run.version.get(k) for k in ("engine_version", "engine_commit", "engine_build")})
    provenance.update({"finished_at": records.utc_now(), "log_file": str(run.log_path), "wall_s": run.wall_s})
    record = records.new_record(
        cfg, status=run.status, reason=run.reason, measurements=build_measurements(run), memory=run.memory,
        prediction=plan.prediction, planned=plan.planned, provenance=provenance, log_tail=run.log_tail,
        prediction_reason=plan.prediction_reason, prediction_error=prediction_error(run.status, plan.verdict),
    )
    record = records.sanitize_record(record)
    path = records.write_record(record, root)
    if run.interrupted:
        raise Interrupted(path)
    return RunOutcome(record, path, plan)
