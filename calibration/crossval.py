"""Cross-validation of the calibrated predictor, error metrics and the error bands ``predict`` shows.

- leave-one-device-out (LODO): for each device, fit the table without its runs and predict them; the
  device then falls back to its family or the engine scope, as an unmeasured GPU would;
- leave-one-model-out (LOMO): for each model (a shrunk architecture counts as its own model), fit
  without it and predict it; its devices keep their device scopes, as a new model on a measured GPU;
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

from calibration.dataset import QUANTITIES, Dataset, measured, predict
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
    return predict(dataset, _with_prior(table, prior))


def _holdout_predictions(dataset: Dataset, column: str, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Out-of-sample predictions when each value of ``column`` is held out in turn (NaN if never)."""
    blocks = dataset.blocks
    out = {q: np.full(len(blocks[_block_of(q)]), np.nan) for q in METRIC_QUANTITIES}
    values: set[str] = set()
    for block in blocks.values():
        values |= {v for v in block.meta[column].dropna().unique() if v}
    for value in sorted(values):
        held = {q: (blocks[q].meta[column].to_numpy() == value) for q in QUANTITIES}
        masks = {q: ~held[q] for q in QUANTITIES}
        if not any(np.any(blocks[q].fittable & masks[q]) for q in QUANTITIES):
            continue
        table = fit_table(dataset, masks, n_boot=0, prior=prior)
        predicted = predict(dataset, _with_prior(table, prior))
        for q in METRIC_QUANTITIES:
            rows = held[_block_of(q)]
            out[q][rows] = predicted[q][rows]
    return out


def _with_prior(table: dict[str, Any], prior: Coefficients | None) -> Coefficients:
    """The fitted table as ``predict`` will read it: alone, or (a user's fit) its device scopes over the prior."""
    return prior.with_devices_from(Coefficients(table)) if prior is not None else Coefficients(table)


def leave_one_device_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    return _holdout_predictions(dataset, "device_id", prior)


def leave_one_model_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    return _holdout_predictions(dataset, "model_key", prior)


def leave_one_source_out(dataset: Dataset, prior: Coefficients | None = None) -> dict[str, np.ndarray]:
    """Each source (``source_set``, see :func:`calibration.observations.source_set`) held out as a whole."""
    return _holdout_predictions(dataset, "source_set", prior)


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
    """MAPE and p90 per quantity, overall, per engine and per device kind (gpu, unified, cpu)."""
    actual = measured(dataset)
    out: dict[str, Any] = {"overall": {}, "engines": {}, "kinds": {}}
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
    return out


def cross_validate(dataset: Dataset, table: dict[str, Any], prior: Coefficients | None = None) -> dict[str, Any]:
    """In-sample, LODO, LOMO and LOSO predictions and metrics: {"predictions": ..., "metrics": ...}.

    With a ``prior`` (a user's fit over the shipped table) every fold starts from it, and a held-out device
    falls back to the prior's scopes, as an unmeasured host would."""
    predictions = {
        "in_sample": in_sample_predictions(dataset, table, prior),
        "lodo": leave_one_device_out(dataset, prior),
        "lomo": leave_one_model_out(dataset, prior),
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
    table["cross_validation"] = {name: m for name, m in cv["metrics"].items()}
    return table
