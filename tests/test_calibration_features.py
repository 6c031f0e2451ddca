"""Features come from the predictor's own formulas: combining them with a table's coefficients gives
exactly what ``predictor.estimate.evaluate`` / ``predict`` give for the same configuration."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_calibration_fit import true_table, write_formula_fixture

from calibration.comparison import block_predictions
from calibration.dataset import load_dataset, predict
from calibration.features import QUANTITY_TERMS, run_arch
from calibration.observations import load_observations, model_key
from calibration.table import fit_table
from harness import records
from predictor.coefficients import Coefficients
from predictor.estimate import predict as predictor_predict


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return write_formula_fixture(tmp_path_factory.mktemp("features_fixture"))


@pytest.mark.parametrize("table_kind", ["defaults", "known", "fitted"])
def test_linear_features_match_the_predictor(fixture_dir, table_kind):
    dataset = load_dataset(fixture_dir)
    table = {"defaults": Coefficients(), "known": true_table(),
             "fitted": Coefficients(fit_table(dataset))}[table_kind]
    linear = predict(dataset, table)
    outputs = {"decode": "decode_step_s", "prefill": "prefill_s", "memory": "total_bytes"}
    for quantity, output in outputs.items():
        direct = block_predictions(dataset.blocks[quantity], table)[output]
        np.testing.assert_allclose(linear[quantity], direct, rtol=1e-9)


def test_decode_feature_matches_one_predict_call(fixture_dir):
    dataset = load_dataset(fixture_dir)
    block = dataset.blocks["decode"]
    row = block.meta.iloc[0]
    estimate = predictor_predict(row["model"], row["device_id"], row["quant"], int(row["context"]),
                                 prompt_tokens=int(row["decode_context"]), coefficients=Coefficients(),
                                 flash_attn=bool(row["flash_attn"]), launch=False)
    assert predict(dataset, Coefficients())["decode"][0] == pytest.approx(estimate.values["decode_step_s"], rel=1e-12)


def test_shrunk_architecture_is_rebuilt_from_the_record(tmp_path):
    overrides = {"num_layers": 4, "vocab_size": 1024}
    config = {"model": "qwen2.5-0.5b", "quant": "Q8_0", "device": "cpu", "context": 512, "arch_overrides": overrides,
              "prompt_tokens": [64], "notes": "SYNTHETIC TEST FIXTURE"}
    record = records.new_record(config, provenance={"host_bandwidth_gbs": 20.0, "host_matmul_gflops": 100.0,
                                                    "synthetic_fixture": True})
    records.write_record(record, tmp_path)
    runs = load_observations(tmp_path).runs
    assert runs.loc[0, "model_key"] == model_key("qwen2.5-0.5b", overrides) == "qwen2.5-0.5b[num_layers=4,vocab_size=1024]"
    arch = run_arch("qwen2.5-0.5b", json.dumps(overrides, sort_keys=True))
    assert (arch.num_layers, arch.vocab_size) == (4, 1024)


def test_every_quantity_has_its_terms():
    assert [t.name for t in QUANTITY_TERMS["decode"]][:3] == [
        "decode_fixed_ms", "decode_fixed_per_layer_us", "decode_bw_efficiency"]
    assert {t.name for t in QUANTITY_TERMS["memory"]} == {"runtime_fixed_gib", "compute_buffer_scale"}
