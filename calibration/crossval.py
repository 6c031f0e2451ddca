"""Cross-validation of the calibrated predictor, error metrics and the error bands ``predict`` shows.

- leave-one-device-out (LODO): for each device, fit the table without its runs and predict them; the
  device then falls back to its family or the engine scope, as an unmeasured GPU would;
- leave-one-model-out (LOMO): for each model (a shrunk architecture counts as its own model), fit
  without it and predict it; its devices keep their device scopes, as a new model on a measured GPU;
- leave-one-family-out (LOFO): for each device family, fit without its devices and predict them: the engine
  scope with the physics prior, as a device of an unmeasured family gets;
- leave-one-source-out (LOSO): for each source (``source_set``: one publisher's set of imported runs, or
  one measuring machine), fit without its runs and predict them: data neither fitted nor sharing a fitted
  run's setup, build or disturbances, as results from a new publisher would be;
- in-sample: the table fitted on everything, predicting the same runs.

Metrics per quantity (decode, prefill, ttft, memory): MAPE (mean absolute percentage error, as a
fraction: 0.05 = 5%) and p90 of the absolute percentage error, overall and per engine.
The error band of a scope is the p90 relative error of its out-of-sample predictions: LOMO residuals
for a device scope, LODO residuals for a family or engine scope.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.model_selection import LeaveOneGroupOut

from calibration.dataset import QUANTITIES, Dataset, as_predicted, measured, predict
from calibration.table import fit_table
from predictor.coefficients import Coefficients

METRIC_QUANTITIES = ("decode", "prefill", "ttft", "memory")
COEFFICIENT_QUANTITY = {"decode": "decode", "prefill": "prefill", "memory": "memory"}


def _block_of(quantity: str) -> str:
    return "prefill" if quantity == "ttft" else quantity


def ape(predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Absolute percentage error as a fraction (NaN where either side is missing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.abs(np.asarray(predicted, float) / np.asarray(actual, float) - 1.0)
    out[~np.isfinite(out)] = np.nan
    return out


RATE_QUANTITIES = ("decode", "prefill")  # reported as tokens per second: errors are on the rate


def quantity_ape(quantity: str, predicted_time_or_bytes: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Absolute percentage error of the quantity as reported: tok/s for decode and prefill (the inverse of
    the fitted times), milliseconds for TTFT, bytes for memory."""
    if quantity in RATE_QUANTITIES:
        return ape(1.0 / np.asarray(predicted_time_or_bytes, float), 1.0 / np.asarray(actual, float))
    return ape(predicted_time_or_bytes, actual)


def summarize_errors(errors: np.ndarray) -> dict[str, Any]:
    """{mape, p90, n} of absolute percentage errors (NaN ignored; None when there is none)."""
    values = errors[np.isfinite(errors)]
    if len(values) == 0:
        return {"mape": None, "p90": None, "n": 0}
    return {"mape": round(float(np.mean(values)), 4), "p90": round(float(np.percentile(values, 90)), 4),
            "n": int(len(values))}


def in_sample_predictions(dataset: Dataset, table: dict[str, Any],
                          prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    return predict(dataset, as_predicted(table, prior))


def _holdout_predictions(dataset: Dataset, column: str, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Out-of-sample predictions when each value of ``column`` is held out in turn (NaN if never)."""
    blocks = dataset.blocks
    out = {q: np.full(len(blocks[_block_of(q)]), np.nan) for q in METRIC_QUANTITIES}
    # every row of every block, grouped by ``column`` (rows without a value are never held out)
    groups = np.concatenate([np.asarray([str(v) if isinstance(v, str) and v else "" for v in blocks[q].meta[column]],
                                        dtype=object) for q in QUANTITIES])
    starts = np.cumsum([0] + [len(blocks[q]) for q in QUANTITIES])
    if len(set(groups)) < 2:  # one group held out leaves nothing to fit on
        return out
    for _, test in LeaveOneGroupOut().split(np.zeros((len(groups), 1)), groups=groups):
        if groups[test[0]] == "":
            continue
        in_test = np.zeros(len(groups), bool)
        in_test[test] = True
        held = {q: in_test[starts[i]:starts[i + 1]] for i, q in enumerate(QUANTITIES)}
        masks = {q: ~held[q] for q in QUANTITIES}
        if not any(np.any(blocks[q].fittable & masks[q]) for q in QUANTITIES):
            continue
        table = fit_table(dataset, masks, n_boot=0, prior=prior)
        predicted = predict(dataset, as_predicted(table, prior))
        for q in METRIC_QUANTITIES:
            rows = held[_block_of(q)]
            out[q][rows] = predicted[q][rows]
    return out


def leave_one_device_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    return _holdout_predictions(dataset, "device_id", prior)


def leave_one_model_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    return _holdout_predictions(dataset, "model_key", prior)


def leave_one_family_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Each device family (memory type / architecture) held out as a whole: its devices then take the engine
    scope with the physics prior (:mod:`predictor.prior`), as a device of a family nobody measured would."""
    return _holdout_predictions(dataset, "family", prior)


def leave_one_source_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Each source (``source_set``, see :func:`calibration.observations.source_set`) held out as a whole."""
    return _holdout_predictions(dataset, "source_set", prior)


def derive_column(dataset: Dataset, column: str) -> None:
    """Add ``backend_resolved`` (:func:`calibration.dataset.run_backend`; "" for vLLM), ``arch_class`` (``dense`` /
    ``moe`` from the catalogue model; "" for a model it does not know) or ``depth_class`` (``at depth`` for a prompt
    after cached tokens, else ``empty cache``) to every block's ``meta``, once."""
    from calibration.dataset import run_backend
    from predictor.models import resolve_model

    classes: dict[str, str] = {}

    def arch_class(model: Any) -> str:
        if model not in classes:
            try:
                classes[model] = "moe" if resolve_model(str(model)).is_moe else "dense"
            except Exception:  # a model file or directory the catalogue does not know: never held out
                classes[model] = ""
        return classes[model]

    for block in dataset.blocks.values():
        if column in block.meta:
            continue
        if column == "backend_resolved":
            block.meta[column] = [run_backend(row) or "" for _, row in block.meta.iterrows()]
        elif column == "depth_class":  # a prompt after cached tokens (llama-bench -d) or from an empty cache
            depth = block.meta["prompt_depth"] if "prompt_depth" in block.meta else [0] * len(block.meta)
            block.meta[column] = ["at depth" if float(d or 0) > 0 else "empty cache" for d in depth]
        else:
            block.meta[column] = [arch_class(m) for m in block.meta["model"]]


def leave_one_backend_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Each llama.cpp backend (CUDA, Metal, ROCm, Vulkan, CPU) held out as a whole: a backend nobody measured."""
    derive_column(dataset, "backend_resolved")
    return _holdout_predictions(dataset, "backend_resolved", prior)


def leave_one_class_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Dense models, then mixtures of experts, held out as a whole."""
    derive_column(dataset, "arch_class")
    return _holdout_predictions(dataset, "arch_class", prior)


def scored_rows(dataset: Dataset, quantity: str, include_noisy: bool = False) -> np.ndarray:
    """Rows whose error counts: valid features, a repeatable measurement (spread <= 5%, unless
    ``include_noisy``), not excluded by its record and, for times, batch 1 (a TTFT or TPOT taken under
    concurrent load includes queueing the model does not describe)."""
    block = dataset.blocks[_block_of(quantity)]
    ok = block.features.valid & ~block.excluded
    if not include_noisy:
        ok &= ~block.noisy
    if quantity != "memory":
        ok &= block.meta["batch"].to_numpy() == 1
    return ok


def error_metrics(dataset: Dataset, predictions: dict[str, np.ndarray]) -> dict[str, Any]:
    """MAPE and p90 per quantity, overall, per engine, per device kind (gpu, unified, cpu) and per origin
    (``imported``: the public results; ``measured``: runs of the harness)."""
    actual = measured(dataset)
    out: dict[str, Any] = {"overall": {}, "engines": {}, "kinds": {}, "origins": {}}
    for q in METRIC_QUANTITIES:
        block = dataset.blocks[_block_of(q)]
        errors = np.where(scored_rows(dataset, q), quantity_ape(q, predictions[q], actual[q]), np.nan)
        out["overall"][q] = summarize_errors(errors)
        for engine in dataset.engines():
            rows = block.meta["engine"].to_numpy() == engine
            out["engines"].setdefault(engine, {})[q] = summarize_errors(errors[rows])
        kinds = block.meta["kind"].to_numpy()
        for kind in sorted({k for k in kinds if k}):
            out["kinds"].setdefault(kind, {})[q] = summarize_errors(errors[kinds == kind])
        origin = np.where(block.meta["source"].to_numpy() == "imported", "imported", "measured")
        for name in ("imported", "measured"):
            out["origins"].setdefault(name, {})[q] = summarize_errors(errors[origin == name])
    return out


def _reason_label(reason: str) -> str:
    """A short name for an exclusion reason: its text up to the first colon where that is short, else its words."""
    head = reason.split(":", 1)[0].strip()
    return head if len(head) <= 48 else " ".join(reason.split()[:6]) + " ..."


def held_out_folds(dataset: Dataset, predictions: dict[str, np.ndarray],
                   quantities: tuple[str, ...] = ("decode", "prefill"), column: str = "source_set",
                   ) -> dict[str, dict[str, Any]]:
    """Per quantity, the imported public results' held-out errors fold by fold (``column``: ``source_set``, or the
    ``backend_resolved`` / ``arch_class`` of :func:`leave_one_backend_out` / :func:`leave_one_class_out`): ``folds``
    (source -> mape, p90, n), ``worst_ratio`` (the largest factor between a scored row's prediction and its
    measurement, either way), ``beyond_2x`` (scored rows more than 2x off) and ``left_out`` (imported rows with a
    prediction that the score leaves out, by reason: an exclusion of their record, or repetitions spreading more
    than 5%)."""
    actual = measured(dataset)
    out: dict[str, dict[str, Any]] = {}
    for q in quantities:
        block = dataset.blocks[_block_of(q)]
        imported = block.meta["source"].to_numpy() == "imported"
        scored = scored_rows(dataset, q) & imported
        errors = np.where(scored, quantity_ape(q, predictions[q], actual[q]), np.nan)
        sources = block.meta[column].astype(str).to_numpy()
        folds = {name: summarize_errors(errors[sources == name]) for name in sorted(set(sources[scored]))}
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.asarray(predictions[q], float) / np.asarray(actual[q], float)
        factor = np.where(scored & np.isfinite(ratio) & (ratio > 0), np.maximum(ratio, 1.0 / ratio), np.nan)
        left: dict[str, int] = {}
        candidates = (imported & block.features.valid & ~scored & (block.meta["batch"].to_numpy() == 1)
                      & np.isfinite(np.asarray(predictions[q], float)))
        reasons = block.meta["exclude_reason"].to_numpy() if "exclude_reason" in block.meta else [None] * len(block)
        for i in np.flatnonzero(candidates):
            reason = reasons[i]
            label = _reason_label(str(reason)) if isinstance(reason, str) and reason else "repetitions spread over 5%"
            left[label] = left.get(label, 0) + 1
        finite = factor[np.isfinite(factor)]
        out[q] = {"folds": folds, "worst_ratio": round(float(finite.max()), 3) if len(finite) else None,
                  "beyond_2x": int((finite > 2.0).sum()), "left_out": dict(sorted(left.items(), key=lambda kv: -kv[1]))}
    return out


def cross_validate(dataset: Dataset, table: dict[str, Any], prior: Coefficients | None = None) -> dict[str, Any]:
    """In-sample, LODO, LOMO and LOSO predictions and metrics: {"predictions": ..., "metrics": ...}.

    With a ``prior`` (a user's fit over the shipped table) every fold starts from it, and a held-out device
    falls back to the prior's scopes, as an unmeasured host would."""
    predictions = {
        "in_sample": in_sample_predictions(dataset, table, prior),
        "lodo": leave_one_device_out(dataset, prior),
        "lomo": leave_one_model_out(dataset, prior),
        "lofo": leave_one_family_out(dataset, prior),
        "loso": leave_one_source_out(dataset, prior),
    }
    metrics = {name: error_metrics(dataset, p) for name, p in predictions.items()}
    return {"predictions": predictions, "metrics": metrics}


def _scope_rows(dataset: Dataset, quantity: str, engine: str, kind: str, name: str | None) -> np.ndarray:
    meta = dataset.blocks[_block_of(quantity)].meta
    rows = meta["engine"].to_numpy() == engine
    if kind == "engine":  # fitted on accelerator runs only (calibration.table.scopes_of)
        rows &= meta["kind"].to_numpy() != "cpu"
    elif kind == "family":
        rows &= meta["family"].to_numpy() == name
    elif kind == "device":
        rows &= meta["device_id"].to_numpy() == name
    return rows & scored_rows(dataset, quantity)


def annotate(table: dict[str, Any], dataset: Dataset, cv: dict[str, Any]) -> dict[str, Any]:
    """Add ``error_band`` per scope and ``cv_mape`` per coefficient from the cross-validated residuals.

    Device scopes use LOMO residuals (a new model on that device); family and engine scopes use LODO
    residuals (a device that was not measured). A scope without out-of-sample residuals gets no band.
    """
    actual = measured(dataset)
    errors = {name: {q: quantity_ape(q, p[q], actual[q]) for q in METRIC_QUANTITIES}
              for name, p in cv["predictions"].items()}
    for engine, eng in table.get("engines", {}).items():
        scopes = [("engine", None, eng.get("default") or {})]
        scopes += [("family", k, v) for k, v in (eng.get("families") or {}).items()]
        scopes += [("device", k, v) for k, v in (eng.get("devices") or {}).items()]
        for kind, name, entry in scopes:
            source = "lomo" if kind == "device" else "lodo"
            band, mape = {}, {}
            for q in METRIC_QUANTITIES:
                rows = _scope_rows(dataset, q, engine, kind, name)
                stats = summarize_errors(errors[source][q][rows])
                if stats["n"]:
                    band[q] = stats["p90"]
                    mape[q] = stats["mape"]
            if band:
                entry["error_band"] = band
                entry["error_band_source"] = f"p90 relative error, {source.upper()} cross-validation"
            for item in entry.values():
                if isinstance(item, dict) and "quantity" in item:
                    item["cv_mape"] = mape.get(item["quantity"])
                    item["cv"] = source
        for kind, entry in ((eng.get("physics") or {}).get("kinds") or {}).items():
            band = {}
            for q in METRIC_QUANTITIES:
                meta = dataset.blocks[_block_of(q)].meta
                rows = ((meta["engine"].to_numpy() == engine) & (meta["kind"].to_numpy() == kind)
                        & scored_rows(dataset, q))
                stats = summarize_errors(errors["lofo"][q][rows])
                if stats["n"]:
                    band[q] = stats["p90"]
            if band:  # how far the prior has been off on families it was not fitted on
                entry["error_band"] = band
                entry["error_band_source"] = "p90 relative error, LOFO cross-validation"
    table["default_error_band"] = default_error_bands(dataset)
    table["cross_validation"] = {name: m for name, m in cv["metrics"].items()}
    return table


def default_error_bands(dataset: Dataset) -> dict[str, dict[str, Any]]:
    """Per device kind, how far the uncalibrated engine defaults have been off: the p90 error of the defaults'
    predictions of every scored run of that kind (any engine). A prediction with no fitted scope (vLLM on a
    GPU, where no vLLM run exists) carries this band, so its uncertainty is stated, not left blank."""
    actual = measured(dataset)
    defaults = predict(dataset, Coefficients())
    out: dict[str, dict[str, Any]] = {}
    for q in ("decode", "prefill"):
        meta = dataset.blocks[_block_of(q)].meta
        errors = quantity_ape(q, defaults[q], actual[q])
        for kind in sorted({k for k in meta["kind"].to_numpy() if k}):
            rows = (meta["kind"].to_numpy() == kind) & scored_rows(dataset, q)
            stats = summarize_errors(errors[rows])
            if not stats["n"]:
                continue
            counts = meta.loc[rows, "engine"].value_counts()
            entry = out.setdefault(kind, {"source": "p90 relative error of the uncalibrated engine defaults "
                                                    f"(predictor/coefficients.py) on the scored {kind} runs:"})
            entry[q] = stats["p90"]
            entry["source"] += f" {q} " + ", ".join(f"{n} {engine}" for engine, n in counts.items()) + ";"
    for entry in out.values():
        entry["source"] = entry["source"].rstrip(";")
    return out
