"""Observations with their features and measured targets, ready to fit and to predict.

:func:`prepare` builds, once per set of runs, the predictor inputs and linear features of every decode,
prefill and memory observation (the expensive part: it runs the predictor's formulas). Fits and
cross-validation folds then only select rows. :func:`predict` turns a coefficients table into
predictions for every row, looking up each row's coefficients exactly as ``predict`` does
(device -> family -> engine -> defaults).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from calibration.features import (
    QUANTITY_TERMS,
    Features,
    Inputs,
    combine,
    frame_inputs,
    quantity_features,
)
from calibration.observations import Observations, load_observations
from predictor.coefficients import Coefficients, CoefficientSet
from predictor.devices import resolve_device
from predictor.errors import BenchcalError

QUANTITIES = ("decode", "prefill", "memory")
MAX_REL_STD = 0.05  # a measurement whose repetitions spread more than 5% is not scored by default
# Fits take measurements up to a 15% spread: the fit uses medians, and a shared 2-core CPU runner spreads
# decode repetitions by 5-10% (MAD) as a rule, which would otherwise leave nothing to fit.
MAX_REL_STD_FIT = 0.15
TARGETS = {"decode": "decode_step_s", "prefill": "prefill_s", "memory": "peak_memory_bytes"}


@dataclass
class Block:
    """One quantity's observations: ``meta`` (one row per observation), features and the target."""

    quantity: str
    meta: pd.DataFrame
    inputs: Inputs
    features: Features
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.meta)

    def _spread_above(self, limit: float) -> np.ndarray:
        """Rows whose repetitions spread (relative MAD or stddev) more than ``limit``."""
        if "rel_std" not in self.meta:
            return np.zeros(len(self.meta), bool)
        rel = pd.to_numeric(self.meta["rel_std"], errors="coerce").to_numpy(dtype=float)
        return np.nan_to_num(rel, nan=0.0) > limit

    @property
    def noisy(self) -> np.ndarray:
        """Rows whose repetitions spread more than ``MAX_REL_STD`` (not scored by default)."""
        return self._spread_above(MAX_REL_STD)

    @property
    def unstable(self) -> np.ndarray:
        """Rows whose repetitions spread more than ``MAX_REL_STD_FIT``: too unstable to fit."""
        return self._spread_above(MAX_REL_STD_FIT)

    @property
    def excluded(self) -> np.ndarray:
        """Rows whose record excludes this quantity from fits (``provenance.excluded_from_fit``, with a reason)."""
        if "exclude_reason" not in self.meta:
            return np.zeros(len(self.meta), bool)
        return self.meta["exclude_reason"].notna().to_numpy() & (self.meta["exclude_reason"].astype(str) != "")

    @property
    def fittable(self) -> np.ndarray:
        """Rows a fit may use: valid features, a positive target, spread <= 15%, not excluded, batch 1 for decode."""
        ok = self.features.valid & np.isfinite(self.y) & (self.y > 0) & ~self.unstable & ~self.excluded
        if self.quantity == "decode":
            ok &= self.meta["batch"].to_numpy() == 1
        return ok


@dataclass
class Dataset:
    """Everything calibration needs from a set of runs."""

    observations: Observations
    blocks: dict[str, Block]

    def engines(self) -> list[str]:
        names: set[str] = set()
        for block in self.blocks.values():
            names |= set(block.meta["engine"].dropna())
        return sorted(names)


def _meta(frame: pd.DataFrame, inputs: Inputs) -> pd.DataFrame:
    meta = frame.reset_index(drop=True).copy()
    meta["device_id"] = [spec["device_id"] if spec else None for spec in inputs.rows]
    meta["family"] = [spec["family"] if spec else None for spec in inputs.rows]
    meta["kind"] = [spec["kind"] if spec else None for spec in inputs.rows]
    meta["problem"] = [inputs.problems.get(i) for i in range(len(inputs.rows))]
    return meta


def make_block(quantity: str, frame: pd.DataFrame) -> Block:
    """Features and targets of one observation table."""
    frame = frame.reset_index(drop=True)
    inputs = frame_inputs(frame)
    if len(frame) == 0:
        terms = QUANTITY_TERMS[quantity]
        empty = Features(quantity, terms, np.zeros(0), np.zeros((0, len(terms))), np.zeros(0, bool))
        return Block(quantity, _meta(frame, inputs), inputs, empty, np.zeros(0))
    features = quantity_features(frame, quantity, inputs)
    y = pd.to_numeric(frame[TARGETS[quantity]], errors="coerce").to_numpy(dtype=float)
    return Block(quantity, _meta(frame, inputs), inputs, features, y)


def prepare(observations: Observations) -> Dataset:
    """Build the three blocks (decode, prefill, memory) of a set of observations."""
    frames = {"decode": observations.decode, "prefill": observations.prefill, "memory": observations.memory}
    return Dataset(observations, {q: make_block(q, frames[q]) for q in QUANTITIES})


def load_dataset(runs_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None) -> Dataset:
    """Read runs and prepare them (see :func:`calibration.observations.load_observations`)."""
    return prepare(load_observations(runs_dirs))


# -------------------------------------------------------------------------------------- predicting


def row_coefficient_sets(meta: pd.DataFrame, table: Coefficients, eras: bool = True) -> list[CoefficientSet | None]:
    """The coefficient set ``predict`` would use for each row (None where the row has no device): with ``eras``,
    the overlay of the row's own build era (``predict --engine-build`` with the run's build)."""
    cache: dict[tuple, CoefficientSet] = {}
    out: list[CoefficientSet | None] = []
    era_column = meta["era"] if eras and "era" in meta else [None] * len(meta)
    kinds = meta["kind"] if "kind" in meta else [None] * len(meta)
    backends = meta["backend"] if "backend" in meta else [None] * len(meta)
    for engine, device, family, era, kind, backend in zip(meta["engine"], meta["device_id"], meta["family"],
                                                          era_column, kinds, backends, strict=True):
        if device is None:
            out.append(None)
            continue
        key = (str(engine), str(device), str(family), era if isinstance(era, str) else None,
               kind if isinstance(kind, str) else None)
        named = backend if isinstance(backend, str) and backend else None  # else the device vendor's default
        if key + (named,) not in cache:
            cache[key + (named,)] = table.lookup(*key, _catalogue_device(str(device)) if kind != "cpu" else None,
                                                 backend=named)
        out.append(cache[key + (named,)])
    return out


@cache
def _catalogue_device(device_id: str):
    """The catalogue device of a row (its memory type and rates feed the physics prior), None off-catalogue."""
    try:
        return resolve_device(device_id)
    except BenchcalError:
        return None


def weights_for(block: Block, sets: list[CoefficientSet | None]) -> np.ndarray:
    """Per-row linear weights of the block's terms (NaN rows where no coefficient set)."""
    terms = block.features.terms
    weights = np.full((len(sets), len(terms)), np.nan)
    for i, cset in enumerate(sets):
        if cset is not None:
            weights[i] = [float(t.weight(cset[t.name])) for t in terms]
    return weights


def predict_block(block: Block, table: Coefficients) -> np.ndarray:
    """Predicted quantity (seconds or bytes) of every row of ``block`` with ``table``."""
    if len(block) == 0:
        return np.zeros(0)
    sets = row_coefficient_sets(block.meta, table)
    return combine(block.features, weights_for(block, sets))


def predict(dataset: Dataset, table: Coefficients) -> dict[str, np.ndarray]:
    """Predictions for every block; ``ttft`` is the prefill prediction (the predictor's TTFT)."""
    out = {q: predict_block(b, table) for q, b in dataset.blocks.items()}
    out["ttft"] = out["prefill"]
    return out


def measured(dataset: Dataset) -> dict[str, np.ndarray]:
    """Measured targets per quantity (``ttft``: measured TTFT seconds of the prefill rows)."""
    out = {q: b.y for q, b in dataset.blocks.items()}
    prefill = dataset.blocks["prefill"].meta
    out["ttft"] = (pd.to_numeric(prefill["ttft_s"], errors="coerce").to_numpy(dtype=float)
                   if "ttft_s" in prefill else np.zeros(0))
    return out


def distinct(values) -> list[str]:
    """The distinct values of a column as sorted strings, missing ones left out."""
    return sorted({str(v) for v in values if v is not None and v == v})


def provenance(block: Block, rows: np.ndarray) -> dict[str, Any]:
    """Which runs a fitted value rests on: counts, devices, models, engine versions and build eras of ``rows``."""
    meta = block.meta.iloc[rows]
    return {
        "n_runs": int(meta["id"].nunique()),
        "n_points": int(len(rows)),
        "devices": distinct(meta["device_id"]),
        "models": distinct(meta["model_key"]),
        "engine_versions": distinct(meta["engine_version"]),
        "eras": distinct(meta["era"]) if "era" in meta else [],
    }


def rounded(x: float) -> float:
    """A fitted figure as the table stores it: six significant digits."""
    return float(f"{float(x):.6g}")


def as_predicted(table: dict[str, Any], prior: Coefficients | None) -> Coefficients:
    """A fitted table as ``predict`` will read it: alone, or (a user's fit) its device scopes over the prior."""
    return prior.with_devices_from(Coefficients(table)) if prior is not None else Coefficients(table)


def run_backend(row: Any) -> str | None:
    """The llama.cpp backend of an observation (a row of a block's ``meta``): the one its run names, else its
    device vendor's default (the host's CPU backend on a CPU); None for vLLM or a device the catalogue does not
    know."""
    from predictor.backends import default_backend
    from predictor.devices import resolve_device

    if row.get("engine") != "llama.cpp":
        return None
    if isinstance(row.get("backend"), str) and row["backend"]:
        return str(row["backend"])
    if row.get("kind") == "cpu":
        return "CPU"
    try:
        found = default_backend(resolve_device(str(row["device_id"])).vendor)
    except Exception:  # a device the catalogue does not know: no default to name
        return None
    return found.id if found is not None else None
