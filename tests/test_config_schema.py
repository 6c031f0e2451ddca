"""Run configurations and sweep files are checked against their JSON Schemas (jsonschema) before anything runs."""

from __future__ import annotations

import jsonschema
import pytest

from harness import sweep
from harness.config_schema import CONFIG_SCHEMA, SWEEP_SCHEMA, check_config
from harness.runconfig import prepare_config
from predictor.errors import BenchcalError

BASE = {"engine": "llama.cpp", "model": "smollm2-135m", "quant": "Q4_0", "device": "cpu", "context": 512}


def test_the_schemas_are_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(CONFIG_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(SWEEP_SCHEMA)


@pytest.mark.parametrize("change,fragment", [
    ({"contxt": 4096}, "unknown key 'contxt'"),
    ({"context": 512.0}, "context: 512.0 is not of type 'integer'"),
    ({"context": True}, "context: True is not of type 'integer'"),
    ({"offload_fraction": float("nan")}, "offload_fraction: nan is not a finite number"),
    ({"offload_fraction": 1.5}, "offload_fraction: 1.5 is greater than the maximum of 1"),
    ({"reps": 0}, "reps: 0 is less than the minimum of 1"),
    ({"prompt_tokens": [64, -1]}, "prompt_tokens"),
    ({"arch_overrides": {"num_layers": 0}}, "arch_overrides.num_layers: 0 is less than the minimum of 1"),
    ({"model": ""}, "model"),
])
def test_a_configuration_the_schema_refuses_names_the_field(change, fragment):
    with pytest.raises(BenchcalError) as refused:
        prepare_config({**BASE, **change})
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_a_good_configuration_passes():
    check_config({**BASE, "prompt_tokens": [64, 256], "arch_overrides": {"num_layers": 4}, "label": "x"})


def test_a_sweep_file_is_checked_as_a_whole(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('name = "x"\n[defaults]\nquant = ["Q4_0", "Q8_0"]\n[[configs]]\nmodel = ["smollm2-135m"]\n'
                    'context = [512, 1024]\nprompt_tokens = [64]\n')
    assert len(sweep.load_sweep(str(good)).configs) == 4
    for text, fragment in (('name = "x"\ndefualts = {}\n[[configs]]\nmodel = "smollm2-135m"\n', "unknown key 'defualts'"),
                           ('name = "x"\n[[configs]]\nmodel = "smollm2-135m"\ngen_tokens = -2\n',
                            "configs[0].gen_tokens"),
                           ('name = "x"\n[[configs]]\nmodel = "smollm2-135m"\nreps = [5, 0]\n', "configs[0].reps")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(BenchcalError) as refused:
            sweep.load_sweep(str(bad))
        assert fragment in str(refused.value), str(refused.value)
