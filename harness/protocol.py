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
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import records
from harness.engines import engine_setup
from harness.engines.runner import DEFAULT_DECODE_PROMPT_TOKENS, run_engine
from harness.measurements import build_measurements
from harness.provenance import base_provenance
from harness.runconfig import (  # the config's own steps, re-exported for the protocol's callers
    log_path_for,
    model_arch,
    prepare_config,
    prepare_weights,
)
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


# -------------------------------------------------------------------------------------------------- plan


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
        from predictor.estimate import predict_scenario
        from predictor.scenario import Scenario
    except ImportError as exc:
        return None, f"predictor unavailable: {exc}"
    prompts = list(cfg["prompt_tokens"] or [])
    try:
        # TTFT and prefill for the longest prompt; decode where the harness measures it: after the shortest
        # prompt, halfway through the generated tokens.
        scenario = Scenario.from_config(cfg, model=model_arch(cfg), device=_predictor_device(cfg, host), host=host)
        prediction = predict_scenario(scenario).to_dict()
        decode_at = min(prompts or [DEFAULT_DECODE_PROMPT_TOKENS]) + int(cfg.get("gen_tokens") or 0) // 2
        decode = predict_scenario(scenario.replace(prompt_tokens=max(decode_at, 1)), launch=False).to_dict()["throughput"]
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
    if not engine_setup(cfg["engine"]).replans_offload or cfg["device"] == "cpu":
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


def prediction_error(status: str, verdict: str | None) -> dict[str, Any] | None:
    """Flag a run whose outcome contradicts the fit verdict (OOM predicted to fit, ok predicted not to fit as
    configured: the stored prediction is for the configuration measured, offload included)."""
    if status == "oom" and verdict == "fits":
        return {"kind": "oom_predicted_fits", "verdict": verdict, "status": status}
    if status == "ok" and verdict in ("does not fit", "needs offload"):
        return {"kind": "ok_predicted_not_fit", "verdict": verdict, "status": status}
    return None


# ------------------------------------------------------------------------------------------------- run


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
    root = records.ensure_writable(records.runs_dir(runs_dir))
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
    path = records.store_record(record, root, say=say)
    if run.interrupted:
        raise Interrupted(path)
    return RunOutcome(record, path, plan)
