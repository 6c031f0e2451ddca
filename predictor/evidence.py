"""How far a prediction's evidence reaches: ``measured``, ``family``, ``prior`` or ``extrapolated``.

The coefficients a prediction uses come from the most specific scope the table has (device -> family -> engine,
:meth:`predictor.coefficients.Coefficients.lookup`, with the physics prior for a device no scope describes). The
level says what stands behind them for *this* prediction:

- ``measured``: the device's own scope, fitted on runs of this engine on this device with this backend (llama.cpp)
  and this format family (the table's ``evidence`` index, written by ``benchcal calibrate``);
- ``family``: runs of this engine and backend, but of the device's family, or of the device in another format
  family;
- ``prior``: no run of the device or its family: the physics prior from the device's memory type and
  FLOPS/bandwidth ratio, fitted on devices of its kind that include some on this backend;
- ``extrapolated``: nothing fitted that describes it: the engine's average over other devices, the uncalibrated
  defaults, runs of the device (or the prior's devices of its kind) on another backend only.

A device whose runs are too few to identify any coefficient of its scope (two runs of one configuration) takes the
level of where its values come from: ``family``, ``prior`` (the physics prior) or ``extrapolated`` (the engine scope);
a measured device whose runs fitted decode but not prefill (or the reverse) keeps its level, and the quantity it did
not fit says so and takes the extrapolated band.

The band is the cross-validated error at that level: the device scope's own (leave-one-model-out) for ``measured``
and for the device in another format family (nothing cross-validates a format alone), leave-one-device-out over the
device's kind for a family scope (its own where wider), the prior's for ``prior``, and for ``extrapolated`` the
widest of the uncalibrated defaults', the leave-one-device-out and the scope's own.
"""

from __future__ import annotations

from typing import Any

from predictor.coefficients import Coefficients, CoefficientSet

LEVELS = ("measured", "family", "prior", "extrapolated")
QUANTITIES = ("decode", "prefill", "ttft", "memory")


def format_family(quant: str | None) -> str:
    """The kernel family a weight format runs through: ``float`` (F32/F16/BF16), ``fp8``, ``legacy`` (llama.cpp's
    Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks), ``k-quant`` (Q2_K-Q6_K and their mixes), ``i-quant`` (IQ*), ``mxfp4``,
    ``int4`` (AWQ/GPTQ checkpoints); ``unknown`` for none."""
    q = str(quant or "").upper()
    if q in ("F32", "F16", "BF16", "FP16", "FP32"):
        return "float"
    if q == "FP8":
        return "fp8"
    if q.startswith("IQ"):
        return "i-quant"
    if "_K" in q:
        return "k-quant"
    if q in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return "legacy"
    if q == "MXFP4":
        return "mxfp4"
    if q in ("AWQ", "GPTQ"):
        return "int4"
    return "unknown"


def evidence_level(cset: CoefficientSet, table: Coefficients, engine: str, device_id: str, kind: str,
                   backend: str | None, quant: str | None) -> dict[str, Any]:
    """The level of one prediction, the basis it names and the band at that level (``{decode, prefill, ...}``
    relative errors, and where they come from)."""
    pairs = table.evidence(engine, device_id)
    family_pairs = table.evidence(engine, cset.scope[7:], "families") if cset.scope.startswith("family:") else []
    fam = format_family(quant)
    backends = {b for b, _ in pairs}
    prior_backend = _prior_backend(table, engine, kind)
    if cset.status == "default":
        level, basis = "extrapolated", f"uncalibrated {engine} defaults: no {engine} run in the table describes it"
    elif cset.scope.startswith("device:") and not _identifies(table, engine, device_id):
        origins = {str(o).split(":", 1)[0] for o in cset.origin.values()}
        level, values = (("family", "its family's values") if "family" in origins
                         else ("prior", "the physics prior's values") if "prior" in origins
                         else ("extrapolated", "the engine scope's values"))
        basis = f"{engine} runs of this device, too few to identify any of its coefficients: {values}"
    elif cset.scope.startswith("device:") and backend is not None and backends and backend not in backends:
        level, basis = "extrapolated", (f"{engine} runs of this device on {', '.join(sorted(map(str, backends)))}, "
                                        f"none on {backend}")
    elif cset.scope.startswith("device:") and (backend, fam) in pairs:
        level, basis = "measured", f"{engine} runs of this device{_on(backend)} in {fam} formats"
    elif cset.scope.startswith("device:"):
        formats = sorted({f for b, f in pairs if b == backend})
        level, basis = "family", (f"{engine} runs of this device{_on(backend)} in {', '.join(formats) or 'other'} "
                                  f"formats, not {fam}")
    elif cset.scope.startswith("family:") and (backend is None or backend in {b for b, _ in family_pairs}):
        level, basis = "family", f"{engine} runs of the {cset.scope[7:]} family{_on(backend)}, not of this device"
    elif cset.scope.startswith("family:"):
        level, basis = "extrapolated", f"{engine} runs of the {cset.scope[7:]} family, none{_on(backend)}"
    elif cset.scope.startswith("prior:") and (backend is None or backend == prior_backend or (
            prior_backend is None and backend in {b for b, _ in table.evidence(engine, kind, "kinds")})):
        level, basis = "prior", ("the physics prior (memory type, FLOPS/bandwidth ratio) fitted on the measured "
                                 f"{kind} devices: no run of this device or its family")
    elif cset.scope.startswith("prior:"):
        level, basis = "extrapolated", (f"the physics prior, fitted on {kind} devices of other backends: no {kind} "
                                        f"device measured on {backend}")
    elif backend is not None and prior_backend not in (None, backend):
        level, basis = "extrapolated", (f"the {engine} average over the measured devices: the physics prior of {kind} "
                                        f"devices describes {prior_backend}'s kernels, not {backend}'s")
    elif table.evidence(engine, kind, "kinds"):
        level, basis = "extrapolated", (f"the {engine} average over the measured devices: {kind} devices were "
                                        "measured, but no run of this device or its family, and no physics prior")
    else:
        level, basis = "extrapolated", f"the {engine} average over the measured devices: none of this device's kind"
    if level == "family" and cset.scope.startswith("device:"):  # the device measured, in other formats
        band, source = {k: float(v) for k, v in cset.error_band.items() if k in QUANTITIES}, (
            f"{cset.band_source} on this device (no {fam} run of it: no cross-validation of the format alone)")
    else:
        band, source = _band(level, cset, table, kind)
    if level in ("measured", "family") and cset.scope.startswith("device:") and _identifies(table, engine, device_id):
        # a quantity the device's runs did not fit (an R9700's prefill, kept out) is the fallback's, with its band
        missing = [q for q in ("decode", "prefill") if not _identifies(table, engine, device_id, q)]
        if missing:
            wide, _source = _band("extrapolated", cset, table, kind)
            for q in missing:
                for name in (q, "ttft") if q == "prefill" else (q,):
                    if name in wide:
                        band[name] = max(band.get(name, 0.0), wide[name])
            basis += (f"; {' and '.join(missing)}: no run of this device fitted it (its family's or the engine "
                      "scope's values, with their wider band)")
    return {"level": level, "basis": basis, "band": band, "band_source": source}


def _identifies(table: Coefficients, engine: str, device_id: str, quantity: str | None = None) -> bool:
    """Whether the device's scope identified at least one of its coefficients (of ``quantity``'s fit, where given):
    two runs of one configuration hold every term at the parent's value."""
    entry = (((table.table.get("engines") or {}).get(engine) or {}).get("devices") or {}).get(device_id) or {}
    return any(isinstance(item, dict) and item.get("identified") and quantity in (None, item.get("quantity"))
               for item in entry.values())


def _prior_backend(table: Coefficients, engine: str, kind: str) -> str | None:
    """The backend the table's physics prior for ``kind`` was fitted on (None: a table that does not say)."""
    physics = (((table.table.get("engines") or {}).get(engine) or {}).get("physics") or {}).get("kinds") or {}
    return (physics.get(kind) or {}).get("backend")


def _on(backend: str | None) -> str:
    return f" on {backend}" if backend else ""


def _band(level: str, cset: CoefficientSet, table: Coefficients, kind: str) -> tuple[dict[str, float], str]:
    own = {k: float(v) for k, v in cset.error_band.items() if k in QUANTITIES}
    cv = table.table.get("cross_validation") or {}
    lodo = {q: float(v["p90"]) for q, v in (((cv.get("lodo") or {}).get("kinds") or {}).get(kind) or {}).items()
            if isinstance(v, dict) and v.get("p90") is not None and q in QUANTITIES}
    defaults = dict((table.table.get("default_error_band") or {}).get(kind) or {})
    default_source = str(defaults.pop("source", ""))
    defaults = {q: float(v) for q, v in defaults.items() if q in QUANTITIES}
    if level == "measured":
        return own, cset.band_source
    if level == "family":
        merged = {q: max(own.get(q, 0.0), lodo.get(q, 0.0)) for q in set(own) | set(lodo)}
        return merged, f"p90 relative error with the device held out (leave-one-device-out, {kind} devices)"
    if level == "prior":
        return own or lodo, cset.band_source or "p90 relative error, leave-one-device-out"
    widest = {q: max(defaults.get(q, 0.0), lodo.get(q, 0.0), own.get(q, 0.0)) for q in set(defaults) | set(lodo)}
    return widest, ("the widest of: " + (default_source or "the uncalibrated defaults' p90") +
                    f"; the p90 with the device held out (leave-one-device-out, {kind} devices); the scope's own")


def device_evidence(table: Coefficients, engine: str, device: Any, quant: str | None,
                    backend: str | None = None) -> dict[str, Any]:
    """:func:`evidence_level` of a prediction on catalogue ``device`` with the table's coefficients as ``predict``
    looks them up (the newest era fitted for its kind), on ``backend`` (None: the device vendor's default for
    llama.cpp): what the leaderboard, matrix and recommend rows name."""
    from predictor.backends import scenario_backend

    found = scenario_backend(backend, device.vendor, device.name, engine)
    cset = table.lookup(engine, device.id, device.family, table.newest_era(engine, device.kind), device.kind, device,
                        backend=found.id if found else None)
    return evidence_level(cset, table, engine, device.id, device.kind, found.id if found else None, quant)


def admits(level: str, wanted: str) -> bool:
    """Whether a prediction at ``level`` passes ``recommend --evidence wanted`` (each level admits those above
    it: measured < family < prior < any)."""
    order = {name: i for i, name in enumerate(LEVELS)}
    return wanted == "any" or order[level] <= order[wanted]
