"""Measured vs predicted: every measured configuration against the predictor with its engine defaults and
with a calibrated coefficient table, and every run's fit verdict. ``benchcal report`` shows them
(:mod:`benchcal.reports.calibration`).

Predictions here come from :func:`predictor.estimate.evaluate` itself, with each run's coefficients
looked up the way ``benchcal predict`` looks them up, so an error in this report is the error a user of
``predict`` would see for that configuration (decode at the run's mean context, prefill at its prompt).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibration.dataset import Block, Dataset, row_coefficient_sets
from calibration.features import evaluate_rows, frame_inputs
from predictor.coefficients import COEFFICIENT_NAMES, Coefficients
from predictor.estimate import VERDICTS

GIB = float(2**30)


def _coefficient_arrays(meta: pd.DataFrame, table: Coefficients) -> dict[str, np.ndarray]:
    sets = row_coefficient_sets(meta, table)
    return {name: np.asarray([s[name] if s is not None else np.nan for s in sets], dtype=float)
            for name in COEFFICIENT_NAMES}


def block_predictions(block: Block, table: Coefficients) -> dict[str, np.ndarray]:
    """evaluate() outputs for a block's rows with ``table``'s coefficients."""
    if len(block) == 0:
        return {"decode_step_s": np.zeros(0), "prefill_s": np.zeros(0), "total_bytes": np.zeros(0)}
    prompts = {"decode": "decode_context", "prefill": "prompt_tokens"}.get(block.quantity)
    prompt = block.meta[prompts].to_numpy(dtype=float) if prompts else np.ones(len(block))
    return evaluate_rows(block.inputs, _coefficient_arrays(block.meta, table), prompt)


def run_verdicts(runs: pd.DataFrame, table: Coefficients) -> tuple[list[str | None], np.ndarray]:
    """Fit verdict and predicted total bytes for every run (failed ones included)."""
    if len(runs) == 0:
        return [], np.zeros(0)
    frame = runs.reset_index(drop=True)
    inputs = frame_inputs(frame)
    meta = frame.assign(device_id=[s["device_id"] if s else None for s in inputs.rows],
                        family=[s["family"] if s else None for s in inputs.rows])
    out = evaluate_rows(inputs, _coefficient_arrays(meta, table), frame["context"].to_numpy(dtype=float),
                        ("verdict", "total_bytes"))
    verdicts = [VERDICTS[int(v)] if np.isfinite(v) else None for v in out["verdict"]]
    return verdicts, out["total_bytes"]


def comparison_rows(dataset: Dataset, default: Coefficients, calibrated: Coefficients) -> dict[str, list[dict]]:
    """Per quantity, one dict per observation: config, measured, predicted (default, calibrated)."""
    out: dict[str, list[dict]] = {}
    for quantity, block in dataset.blocks.items():
        pd_default = block_predictions(block, default)
        pd_cal = block_predictions(block, calibrated)
        rows = []
        for i, meta in enumerate(block.meta.to_dict("records")):
            base = {k: meta.get(k) for k in ("id", "engine", "device", "model_key", "quant", "context", "source")}
            batch = int(meta.get("batch") or 1)
            base["excluded"] = (f"excluded: {meta['exclude_reason']}" if block.excluded[i] else
                                "noisy" if block.noisy[i] else
                                f"batch {batch}" if quantity != "memory" and batch != 1 else None)
            base["group"] = f"{meta['engine']}/{meta['device']}"
            if quantity == "decode":
                meas = 1.0 / block.y[i]
                base.update(point=f"ctx {meta['decode_context']:.0f}", measured=meas,
                            default=1.0 / pd_default["decode_step_s"][i], calibrated=1.0 / pd_cal["decode_step_s"][i])
                rows.append(base)
            elif quantity == "prefill":
                n = float(meta["prompt_tokens"])
                point = dict(base, point=f"{n:.0f} tokens")
                if np.isfinite(block.y[i]):
                    rows.append(dict(point, quantity="prefill", measured=n / block.y[i],
                                     default=n / pd_default["prefill_s"][i], calibrated=n / pd_cal["prefill_s"][i]))
                ttft = meta.get("ttft_s")
                if ttft is not None and np.isfinite(ttft):
                    out.setdefault("ttft", []).append(dict(point, measured=1000 * ttft,
                                                           default=1000 * pd_default["prefill_s"][i],
                                                           calibrated=1000 * pd_cal["prefill_s"][i]))
            else:
                rows.append(dict(base, point=f"ctx {meta['context']}", measured=block.y[i] / GIB,
                                 default=pd_default["total_bytes"][i] / GIB,
                                 calibrated=pd_cal["total_bytes"][i] / GIB))
        out[quantity] = rows
    out.setdefault("ttft", [])
    return out
