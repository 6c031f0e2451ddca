"""Engine coefficients: the named constants of the analytical model, and where each came from.

Every prediction uses one :class:`CoefficientSet` per (engine, device). Defaults live in
``ENGINE_DEFAULTS`` with their public source; a coefficients file written by ``benchcal calibrate``
overrides them, per device where that device was measured, else per device family
(``memory_type/architecture``), else per engine. A prediction says which scope it used.

Coefficients file (JSON)::

    {"schema_version": 1, "source": "...", "created_at": "...",
     "engines": {"llama.cpp": {"default": {NAME: VALUE | {"value": v, "uncertainty": u, ...}},
                               "families": {"hbm3e/hopper": {...}},
                               "devices": {"h200": {...}}}}}

Every coefficient's name, unit, meaning and default with its source are declared once in
:mod:`predictor.registry`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from predictor.engines import ENGINES
from predictor.eras import era_applies, era_terms, eras, run_era
from predictor.errors import BenchcalError
from predictor.registry import COEFFICIENT_NAMES, ENGINE_DEFAULTS

DEFAULT_SOURCE = "engine defaults (predictor/coefficients.py, uncalibrated)"


@dataclass(frozen=True)
class CoefficientSet:
    """The coefficients one prediction uses, with where they came from.

    ``status`` is ``default`` or ``calibrated``; ``scope`` is ``engine``, ``family:<name>``, ``device:<id>`` or
    ``prior:physics/<kind>`` (the engine scope with the physics prior's values); ``era`` the engine build era whose overlay was applied (None: builds pooled); ``uncertainty`` maps a coefficient name to a relative 1-sigma error (0.1 = 10%),
    and ``error_band`` maps a predicted quantity (decode, prefill, ttft, memory) to a relative error
    band from cross-validated residuals, when calibration provides them.
    """

    engine: str
    values: dict[str, float]
    status: str = "default"
    scope: str = "engine"
    source: str = DEFAULT_SOURCE
    uncertainty: dict[str, float] = field(default_factory=dict)
    error_band: dict[str, float] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # coefficient -> scope it came from ("default" if none)
    era: str | None = None
    band_source: str = ""  # where error_band comes from

    def source_of(self, name: str) -> str:
        """Where one coefficient's value comes from: a calibrated scope of the table, or its default's source."""
        scope = self.origin.get(name, "default")
        if scope == "default":
            return "default: " + ENGINE_DEFAULTS[self.engine][name][1]
        if scope.startswith("prior:"):
            return (f"physics prior ({scope[6:]}): from the device's memory type and FLOPS/bandwidth ratio, "
                    f"fitted on the measured devices: {self.source}")
        return f"calibrated ({scope}): {self.source}"

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def _entry_eras(engine: str, entry: dict[str, Any]) -> set[str | None]:
    """The eras of the runs a coefficient was fitted on: its ``eras`` list, else read from its engine versions."""
    if isinstance(entry.get("eras"), list):
        return set(entry["eras"])
    return {run_era(engine, version) for version in entry.get("engine_versions") or []}


def _default_values(engine: str) -> dict[str, float]:
    return {name: value for name, (value, _src) in ENGINE_DEFAULTS[engine].items()}


def _plain(entry: dict[str, Any]) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Split a scope's entry into (values, relative uncertainties, error bands)."""
    values: dict[str, float] = {}
    unc: dict[str, float] = {}
    bands: dict[str, float] = {}
    for name, item in entry.items():
        if name == "error_band" and isinstance(item, dict):
            bands.update({k: float(v) for k, v in item.items()})
            continue
        if name not in COEFFICIENT_NAMES:
            continue
        if isinstance(item, dict):
            values[name] = float(item["value"])
            if item.get("uncertainty") is not None and item["value"]:
                unc[name] = abs(float(item["uncertainty"]) / float(item["value"]))
        else:
            values[name] = float(item)
    return values, unc, bands


@dataclass(frozen=True)
class Coefficients:
    """A loaded coefficients table (or the engine defaults when ``table`` is empty)."""

    table: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def source(self) -> str:
        if not self.table:
            return DEFAULT_SOURCE
        return str(self.table.get("source") or self.path or "coefficients file")

    def lookup(self, engine: str, device_id: str, family: str, era: str | None = None,
               kind: str | None = None, device: Any = None, backend: str | None = None) -> CoefficientSet:
        """Coefficients for ``engine`` on a device: device -> family -> engine scope -> defaults.

        With ``era`` (an engine build era, :mod:`predictor.eras`) and the device's ``kind``, the table's overlay
        for that era and kind (``engines.<engine>.eras.<era>.kinds.<kind>``) replaces each era term
        (``era_terms``: the fixed times, prefill's matmul efficiency) that the chosen scope fitted on runs of
        other eras too; a scope fitted on that era's runs alone keeps its own value.

        With the catalogue ``device`` (its memory type, bandwidth and matmul rate), a device that has neither a
        device nor a family scope takes the table's physics prior for its kind (:mod:`predictor.prior`) for
        the coefficients the prior describes, instead of the engine scope's average; a prior fitted on one llama.cpp
        backend's devices (its ``backend``) describes only a device predicted on that backend (``backend``; None:
        the device vendor's default)."""
        if engine not in ENGINE_DEFAULTS:
            raise BenchcalError(f"unknown engine '{engine}' (choose from: {', '.join(ENGINES)})")
        values = _default_values(engine)
        eng = (self.table.get("engines") or {}).get(engine) or {}
        # Least to most specific: each scope overrides the coefficients it fitted.
        scopes = [
            ("engine", eng.get("default")),
            ("family:" + family, (eng.get("families") or {}).get(family)),
            ("device:" + device_id, (eng.get("devices") or {}).get(device_id)),
        ]
        used = [(scope, _plain(entry)) for scope, entry in scopes if entry]
        if not used:  # engine defaults: the band is how far the defaults' model has been off on this kind
            band = dict((self.table.get("default_error_band") or {}).get(kind or "") or {})
            note = str(band.pop("source", ""))
            return CoefficientSet(engine, values, error_band={k: float(v) for k, v in band.items()
                                                              if k in ("decode", "prefill", "ttft", "memory")},
                                  band_source=note)
        unc: dict[str, float] = {}
        bands: dict[str, float] = {}
        origin: dict[str, str] = {}
        for scope, (fitted, scope_unc, scope_bands) in used:
            values.update(fitted)
            unc.update(scope_unc)
            bands.update(scope_bands)
            origin.update({name: scope for name in fitted})
        # a device scope merged from the user's own table names that table as its source
        entries = dict(scopes)
        source = str((entries.get(used[-1][0]) or {}).get("source") or self.source)
        physics = (eng.get("physics") or {}).get("kinds", {}).get(kind or "") if device is not None else None
        if physics and physics.get("backend") and _backend_of(engine, device, backend) != physics["backend"]:
            physics = None  # the prior describes another backend's kernels
        band_source = next((str(e.get("error_band_source")) for _, e in reversed(scopes)
                            if e and e.get("error_band_source")), "")
        scope_name = used[-1][0]
        if physics:
            from predictor.prior import prior_values

            units, clock = getattr(device, "compute_units", None), getattr(device, "boost_clock_mhz", None)
            prior = prior_values(physics, getattr(device, "memory_type", None), device.matmul_tflops(engine),
                                 getattr(device, "bandwidth_gbs", None), getattr(device, "bytes_per_unit_cycle", None),
                                 units * clock * 1e6 if units and clock else None, era_applies(engine, device))
            # a device or family scope that did not identify a term (held at its parent's, the engine's value:
            # a family measured in prefill only holds decode's bandwidth) leaves it to the prior too
            measured = {name for scope, entry in scopes[1:] if entry for name, item in entry.items()
                        if isinstance(item, dict) and item.get("identified", True)}
            prior = {name: value for name, value in prior.items() if name not in measured}
            values.update(prior)
            origin.update({name: f"prior:physics/{kind}" for name in prior})
            for name in prior:
                unc.pop(name, None)
            if used[-1][0] == "engine":
                bands = dict(physics.get("error_band") or bands)
                band_source = str(physics.get("error_band_source") or "")
                scope_name = f"prior:physics/{kind}" if prior else scope_name
        overlay = self.era_overlay(engine, era, kind) if era and kind and era_applies(engine, device) else {}
        applied = None
        for name, item in overlay.items():
            if name not in era_terms(engine) or not isinstance(item, dict) or not item.get("identified", True):
                continue
            own = (entries.get(origin.get(name, "")) or {}).get(name)
            if isinstance(own, dict) and own.get("identified", True) and _entry_eras(engine, own) == {era}:
                continue  # fitted on this era's runs alone (a value held at its parent's is not)
            values[name] = float(item["value"])
            if item.get("unit_knee") and device is not None:  # the era's kernels' per-unit limit (prefill)
                from predictor.prior import flops_per_unit_cycle, knee_factor

                values[name] *= knee_factor(item["unit_knee"], flops_per_unit_cycle(device, engine))
            origin[name] = f"era:{era}/{kind}"
            applied = era
            if item.get("uncertainty") is not None and item["value"]:
                unc[name] = abs(float(item["uncertainty"]) / float(item["value"]))
        return CoefficientSet(engine, values, "calibrated", scope_name, source, unc, bands, origin, applied,
                              band_source)

    def evidence(self, engine: str, name: str, key: str = "devices") -> list[tuple[str | None, str]]:
        """The (backend, format family) pairs of the runs of ``engine`` the table was fitted on, of the device
        ``name`` (``key`` ``devices``), the device family (``families``) or the device kind (``kinds``: gpu,
        unified, cpu): ``engines.<engine>.evidence``, written by ``benchcal calibrate`` (:mod:`predictor.evidence`)."""
        found = ((((self.table.get("engines") or {}).get(engine) or {}).get("evidence") or {}).get(key) or {})
        return [(pair[0], pair[1]) for pair in found.get(name) or []]

    def era_overlay(self, engine: str, era: str | None, kind: str | None) -> dict[str, Any]:
        """The era terms fitted for ``era`` on devices of ``kind`` (empty when the table has none)."""
        eras = ((self.table.get("engines") or {}).get(engine) or {}).get("eras") or {}
        return dict(((eras.get(era or "") or {}).get("kinds") or {}).get(kind or "") or {})

    def newest_era(self, engine: str, kind: str) -> str | None:
        """The newest era (catalogue order) with an overlay for ``kind``: what ``predict`` uses by default."""
        fitted = [e.id for e in eras(engine) if self.era_overlay(engine, e.id, kind)]
        return fitted[-1] if fitted else None

    def host_figures(self, engine: str, device_id: str) -> dict[str, Any] | None:
        """The probe figures a CPU host's coefficients were fitted against (``bandwidth_gbs``, ``matmul_gflops``),
        or None when the table has no scope for that host."""
        entry = (((self.table.get("engines") or {}).get(engine) or {}).get("devices") or {}).get(device_id) or {}
        figures = entry.get("host_figures")
        return dict(figures) if isinstance(figures, dict) and figures.get("bandwidth_gbs") else None

    def serving_fit(self, engine: str, device_id: str) -> dict[str, Any] | None:
        """The serving model's fitted server terms for ``engine`` on ``device_id`` (``serving`` section, written by
        :mod:`calibration.serving`), or None when no serving run of it was fitted."""
        entry = ((self.table.get("serving") or {}).get(engine) or {}).get(device_id)
        return dict(entry) if isinstance(entry, dict) else None

    def has_device(self, engine: str, device_id: str) -> bool:
        """True when the table has a device scope for ``device_id`` (the device was measured)."""
        return bool((((self.table.get("engines") or {}).get(engine) or {}).get("devices") or {}).get(device_id))

    def with_devices_from(self, other: Coefficients) -> Coefficients:
        """This table with the device scopes and serving fits of ``other`` (a user's fit) replacing its own, with
        their evidence index; the families and engine scopes stay this table's. Each merged scope carries
        ``other``'s source."""
        if not other.table:
            return self
        table = json.loads(json.dumps(self.table)) if self.table else {"schema_version": 1, "engines": {}}
        for engine, eng in (other.table.get("engines") or {}).items():
            mine = table.setdefault("engines", {}).setdefault(engine, {"default": {}, "families": {}, "devices": {}})
            for device_id, entry in (eng.get("devices") or {}).items():
                mine.setdefault("devices", {})[device_id] = {**entry, "source": entry.get("source") or other.source}
                # and what runs the merged scope was fitted on (predictor.evidence)
                found = ((eng.get("evidence") or {}).get("devices") or {}).get(device_id)
                if found is not None:
                    mine.setdefault("evidence", {}).setdefault("devices", {})[device_id] = found
        for engine, fits in (other.table.get("serving") or {}).items():
            table.setdefault("serving", {}).setdefault(engine, {}).update(fits)
        merged_from = [p for p in (self.path, other.path) if p]
        return Coefficients(table, " + ".join(merged_from) or None)


def _backend_of(engine: str, device: Any, backend: str | None) -> str | None:
    """The llama.cpp backend a lookup describes: ``backend`` (a name), else the device vendor's default."""
    from predictor.backends import default_backend, find_backend
    from predictor.engines import traits

    if not traits(engine).gguf:  # ggml's backends are a GGUF engine's
        return None
    found = find_backend(backend) if backend else default_backend(getattr(device, "vendor", ""))
    return found.id if found is not None else None


def load_coefficients(path: str | Path | None) -> Coefficients:
    """Read a coefficients JSON file; ``None`` means engine defaults. Bad files raise BenchcalError."""
    if path is None:
        return Coefficients()
    p = Path(path)
    if not p.is_file():
        raise BenchcalError(f"coefficients file not found: {p}")
    try:
        table = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchcalError(f"coefficients file {p} is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise BenchcalError(f"coefficients file {p} is not a text file (not UTF-8)") from None
    if not isinstance(table, dict) or not isinstance(table.get("engines"), dict):
        raise BenchcalError(f"coefficients file {p} has no 'engines' table")
    return Coefficients(table, str(p))


def default_coefficients_path() -> Path | None:
    """The shipped calibration table (calibration/coefficients.json), if present beside the packages."""
    candidate = Path(__file__).resolve().parent.parent / "calibration" / "coefficients.json"
    return candidate if candidate.is_file() else None


def default_coefficients() -> Coefficients:
    """What ``predict`` uses by default: the shipped table, with the device scopes of the user's own fit
    (``$BENCHCAL_HOME/calibration/coefficients.json``, :mod:`predictor.userdata`) replacing its own."""
    from predictor.userdata import user_coefficients_path

    shipped = load_coefficients(default_coefficients_path())
    user_path = user_coefficients_path()
    return shipped.with_devices_from(load_coefficients(user_path)) if user_path else shipped


HOST_UNCALIBRATED = "uncalibrated on this host; `make bench` calibrates it in ~3.5 minutes"


def host_calibration_note(kind: str, device_id: str, scope: str) -> str | None:
    """For a CPU no run describes: says its coefficients are a prior from other hosts, and how to fit its own."""
    if kind != "cpu" or scope == f"device:{device_id}":
        return None
    prior = "engine defaults" if scope == "engine" else f"prior from {scope}"
    return f"{device_id}: {HOST_UNCALIBRATED} ({prior})"
