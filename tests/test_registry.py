"""One coefficient registry: every module reads its names, defaults, bounds, terms, units and where it acts."""

from __future__ import annotations

from calibration import features, fit, output
from predictor import coefficients
from predictor.engines import ENGINES
from predictor.registry import COEFFICIENT_NAMES, ENGINE_DEFAULTS, FIT_TERMS, REGISTRY


def test_every_coefficient_is_declared_once_with_all_it_needs():
    assert coefficients.COEFFICIENT_NAMES is COEFFICIENT_NAMES and coefficients.ENGINE_DEFAULTS is ENGINE_DEFAULTS
    for name, c in REGISTRY.items():
        assert c.name == name and c.unit and c.meaning
        assert set(c.defaults) == set(ENGINES), name
        for value, source in c.defaults.values():
            assert isinstance(value, float) and source, name
    fitted = {name for names in FIT_TERMS.values() for name in names}
    for name in fitted:
        c = REGISTRY[name]
        assert c.bounds is not None and c.bounds[0] < c.bounds[1], name
        for value, _ in c.defaults.values():  # the defaults lie within the bounds a fit keeps
            assert c.bounds[0] <= value <= (c.cpu_upper or c.bounds[1]) or value == 0.0 and not c.inverse, name
        assert c.inverse == name.endswith("efficiency"), name  # an efficiency enters the model as its inverse


def test_the_fit_the_features_and_the_tables_read_the_registry():
    assert fit.BOUNDS == {n: c.bounds for n, c in REGISTRY.items() if c.bounds is not None}
    assert {q: tuple(t.name for t in terms) for q, terms in features.QUANTITY_TERMS.items()} == FIT_TERMS
    assert all(t.inverse == REGISTRY[t.name].inverse for terms in features.QUANTITY_TERMS.values() for t in terms)
    assert not hasattr(output, "UNITS")


def test_where_a_coefficient_acts():
    assert REGISTRY["vllm_graph_gib"].acts("vllm", "gpu") and not REGISTRY["vllm_graph_gib"].acts("llama.cpp", "gpu")
    assert REGISTRY["prefill_unpack_flops_per_weight"].acts("llama.cpp", "unified")
    assert not REGISTRY["prefill_unpack_flops_per_weight"].acts("llama.cpp", "gpu")
    assert not any(REGISTRY["prefill_dequant_bytes_per_weight"].acts(e, "gpu") for e in ENGINES)
