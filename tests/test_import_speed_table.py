"""Qwen's published vLLM speed tables (tests/data/imported/qwen2.5-speed, qwen2-speed; sources in
tests/data/imported/README.md): the grid-table parser, the import, and the vLLM step the table fits on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.importers_speed_table import import_speed_table, parse_environment, parse_speed_tables
from harness import records
from predictor.errors import BenchcalError

DATA = Path(__file__).parent / "data" / "imported"
QWEN25 = DATA / "qwen2.5-speed" / "speed_benchmark.rst"
QWEN2 = DATA / "qwen2-speed" / "speed_benchmark.rst"
MODELS = {f"Qwen2.5-{s}-Instruct": f"qwen2.5-{s.lower()}" for s in ("0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B")}


def test_the_vllm_tables_are_read_with_their_row_spans():
    text = QWEN25.read_text()
    assert parse_environment(text) == ("0.6.3", "NVIDIA A100 80GB")
    assert parse_environment(QWEN2.read_text()) == ("0.4.2", "NVIDIA A100 80GB")
    rows = parse_speed_tables(text)
    assert {r["section"] for r in rows} == {"0.5B", "1.5B", "3B", "7B", "14B", "32B", "72B"}  # vLLM's, not Transformers'
    first = rows[0]
    assert (first["model_name"], first["input_len"], first["quantization"], first["gpu_num"], first["speed"]) == (
        "Qwen2.5-0.5B-Instruct", 1, "BF16", 1, 311.55)
    # a blank cell continues the one above: the 6144-token GPTQ-Int8 row of the 0.5B table
    assert {"model_name": "Qwen2.5-0.5B-Instruct", "input_len": 6144, "quantization": "GPTQ-Int8", "gpu_num": 1,
            "speed": 254.10, "section": "0.5B"} in rows
    assert {(r["gpu_num"], r["input_len"]) for r in rows if r["section"] == "72B" and r["quantization"] == "BF16"} >= {
        (2, 1), (4, 1), (4, 6144)}
    with pytest.raises(BenchcalError, match="no '\\(vLLM\\)' speed table"):
        parse_speed_tables("-  0.5B (Transformer)\n")


def test_import_keeps_short_prompts_in_catalogue_formats(tmp_path):
    written, messages = import_speed_table(QWEN25, models=MODELS, runs_dir=tmp_path, gpu="a100-sxm-80gb",
                                           source_url="https://example.org/page")
    assert len(written) == 45
    assert sum("GPTQ-Int8 has no catalogue format" in m for m in messages) == 36
    assert sum("prefill is no small part" in m for m in messages) == 66
    stored = [r.record for r in records.iter_records(tmp_path)]
    one = next(r for r in stored if r["config"]["model"] == "qwen2.5-0.5b" and r["config"]["quant"] == "BF16"
               and r["measurements"]["decode"]["context_at_start"] == 1)
    assert one["config"]["engine"] == "vllm" and one["config"]["batch"] == 1 and one["config"]["gen_tokens"] == 2048
    assert one["measurements"]["decode"]["decode_tok_s"]["median"] == 311.55
    assert one["provenance"]["engine_version"] == "vllm 0.6.3"
    assert {r["config"]["quant"] for r in stored} == {"BF16", "AWQ", "GPTQ"}
    assert {r["config"]["device_count"] for r in stored if r["config"]["model"] == "qwen2.5-72b"} == {1, 2, 4}
    again, messages = import_speed_table(QWEN25, models=MODELS, runs_dir=tmp_path, gpu="a100-sxm-80gb")
    assert again == [] and sum("already imported" in m for m in messages) == 45


def test_awq_before_awq_marlin_runs_an_unpacking_kernel():
    from predictor.eras import unpacking_kernel

    assert unpacking_kernel("vllm", "vllm 0.4.2", "AWQ") and unpacking_kernel("vllm", "0.5.2", "AWQ")
    assert not unpacking_kernel("vllm", "0.5.3", "AWQ") and not unpacking_kernel("vllm", "0.6.3", "AWQ")
    assert not unpacking_kernel("vllm", "vllm 0.4.2", "GPTQ") and not unpacking_kernel("vllm", None, "AWQ")
    assert not unpacking_kernel("llama.cpp", "0.4.2", "AWQ")


def test_the_shipped_vllm_step_has_a_floor_and_prices_the_awq_gemm_kernel():
    """The vLLM GPU step fitted on the speed tables: a fixed time per step and per layer (what makes a 0.5B model
    decode at ~300 tokens/s, not the 1,500 its bytes allow), and the AWQ GEMM kernel's unpacking before 0.5.3."""
    from predictor.coefficients import default_coefficients_path, load_coefficients
    from predictor.estimate import predict

    table = load_coefficients(default_coefficients_path())
    scope = table.table["engines"]["vllm"]["devices"]["a100-sxm-80gb"]
    for name in ("decode_fixed_ms", "decode_fixed_per_layer_us", "decode_bw_efficiency",
                 "decode_kquant_flops_per_weight"):
        assert scope[name]["identified"], name
    assert scope["decode_fixed_per_layer_us"]["value"] > 30.0

    def decode(model: str, quant: str, build: str) -> float:
        return predict(model, "a100-sxm-80gb", quant, 8192, engine="vllm", prompt_tokens=1, engine_build=build,
                       coefficients=table).values["decode_tok_s"]

    # measured (the tables' 1-token rows): 0.5B BF16 311.55 (0.6.3), 7B AWQ 148.10 (0.6.3) and 96.65 (0.4.2)
    assert decode("qwen2.5-0.5b", "BF16", "0.6.3") == pytest.approx(311.55, rel=0.25)
    assert decode("qwen2.5-7b", "AWQ", "0.6.3") == pytest.approx(148.10, rel=0.10)
    assert decode("qwen2.5-7b", "AWQ", "0.4.2") == pytest.approx(96.65, rel=0.10)
