"""Weight formats and KV-cache dtypes: sizes, name resolution, engine support."""

from __future__ import annotations

import pytest

from predictor.errors import BenchcalError
from predictor.quants import (
    kv_dtype_ids,
    kv_dtypes,
    normalize_engine,
    quant_formats,
    quant_ids,
    resolve_kv_dtype,
    resolve_quant,
)

BRIEF_FORMATS = ["Q4_K_M", "F16", "BF16", "FP8", "Q8_0", "Q6_K", "Q5_K_M", "Q4_0", "IQ4_XS", "Q3_K_M", "Q2_K",
                 "UD-Q2_K_XL", "AWQ", "GPTQ", "MXFP4", "F32"]


def test_catalogue_covers_the_common_formats():
    assert set(BRIEF_FORMATS) <= set(quant_ids())


def test_every_format_cites_a_url_and_runs_somewhere():
    for fmt in quant_formats():
        assert fmt.source.startswith("https://"), fmt.id
        assert fmt.engines and set(fmt.engines) <= {"llama.cpp", "vllm"}, fmt.id
        assert fmt.compute_bits == 16, fmt.id


def test_bits_per_weight_is_positive_or_left_to_the_file():
    for fmt in quant_formats():
        if fmt.bits_per_weight is None:
            assert "file" in fmt.description, fmt.id
        else:
            assert 2 < fmt.bits_per_weight <= 32, fmt.id


@pytest.mark.parametrize(("fmt_id", "bits"), [
    ("F32", 32), ("F16", 16), ("BF16", 16), ("FP8", 8), ("Q8_0", 34 * 8 / 32), ("Q6_K", 210 * 8 / 256),
    ("Q4_0", 18 * 8 / 32), ("IQ4_XS", 136 * 8 / 256), ("MXFP4", 17 * 8 / 32), ("AWQ", 4 + 20 / 128),
    ("GPTQ", 4 + 20 / 128),
])
def test_single_type_formats_use_their_block_size(fmt_id, bits):
    assert resolve_quant(fmt_id).bits_per_weight == pytest.approx(bits)


@pytest.mark.parametrize(("fmt_id", "low", "high"), [
    ("Q5_K_M", 5.5, 5.8), ("Q4_K_M", 4.8, 5.0), ("Q3_K_M", 3.8, 4.1), ("Q2_K", 2.9, 3.2),
])
def test_k_quant_mixes_sit_above_their_base_block_size(fmt_id, low, high):
    assert low <= resolve_quant(fmt_id).bits_per_weight <= high


def test_mxfp4_keeps_non_expert_tensors_in_bf16():
    mxfp4 = resolve_quant("MXFP4")
    assert mxfp4.bits_per_weight_non_expert == 16.0
    assert mxfp4.weight_bits(is_expert=True) == 4.25
    assert mxfp4.weight_bits(is_expert=False) == 16.0
    assert resolve_quant("Q4_K_M").weight_bits(is_expert=False) == resolve_quant("Q4_K_M").bits_per_weight


def test_gguf_formats_name_their_ggml_type_and_file_type():
    for fmt in quant_formats():
        if fmt.engines == ("llama.cpp",):
            assert fmt.gguf_type and fmt.llama_ftype is not None, fmt.id
    assert (resolve_quant("Q4_K_M").gguf_type, resolve_quant("Q4_K_M").llama_ftype) == ("Q4_K", 15)
    assert resolve_quant("AWQ").gguf_type is None


@pytest.mark.parametrize("name", ["q4_k_m", "Q4-K-M", "q4 k m", "Q4_K"])
def test_quant_names_ignore_case_and_punctuation(name):
    assert resolve_quant(name).id == "Q4_K_M"


@pytest.mark.parametrize(("name", "fmt_id"), [("fp16", "F16"), ("bfloat16", "BF16"), ("ud-q2_k_xl", "UD-Q2_K_XL"),
                                              ("awq-int4", "AWQ"), ("mxfp4_moe", "MXFP4")])
def test_quant_aliases_resolve(name, fmt_id):
    assert resolve_quant(name).id == fmt_id


def test_unknown_quant_suggests_close_names():
    with pytest.raises(BenchcalError, match=r"unknown quant 'Q4_K_MM' \(did you mean: Q4_K_M"):
        resolve_quant("Q4_K_MM")


def test_awq_is_refused_for_llama_cpp_with_the_supported_list():
    with pytest.raises(BenchcalError, match=r"quant 'AWQ' is not supported by llama.cpp \(supported: .*Q4_K_M"):
        resolve_quant("AWQ", "llama.cpp")


def test_gguf_k_quants_are_refused_for_vllm():
    with pytest.raises(BenchcalError, match="not supported by vllm"):
        resolve_quant("Q4_K_M", "vllm")


@pytest.mark.parametrize("fmt_id", ["F16", "BF16", "MXFP4"])
def test_some_formats_run_on_both_engines(fmt_id):
    assert resolve_quant(fmt_id, "llama.cpp").id == resolve_quant(fmt_id, "vllm").id == fmt_id


def test_quant_ids_filter_by_engine():
    assert "FP8" in quant_ids("vllm") and "FP8" not in quant_ids("llama.cpp")
    assert "Q8_0" in quant_ids("llama-cpp") and "Q8_0" not in quant_ids("vLLM")


def test_unknown_engine_is_a_user_error():
    with pytest.raises(BenchcalError, match="unknown engine 'tgi'"):
        resolve_quant("F16", "tgi")
    assert normalize_engine("llama_cpp") == "llama.cpp"


@pytest.mark.parametrize(("dtype_id", "nbytes"), [
    ("f16", 2), ("bf16", 2), ("q8_0", 34 / 32), ("q4_0", 18 / 32), ("fp8", 1), ("f32", 4),
])
def test_kv_dtype_bytes_include_block_scales(dtype_id, nbytes):
    assert resolve_kv_dtype(dtype_id).bytes_per_element == pytest.approx(nbytes)


def test_every_kv_dtype_cites_a_url():
    for dtype in kv_dtypes():
        assert dtype.source.startswith("https://"), dtype.id


def test_kv_dtypes_per_engine():
    assert {"f16", "bf16", "q8_0", "q4_0"} <= set(kv_dtype_ids("llama.cpp"))
    assert "fp8" not in kv_dtype_ids("llama.cpp")
    assert set(kv_dtype_ids("vllm")) == {"f16", "bf16", "fp8"}


def test_fp8_cache_is_refused_for_llama_cpp():
    with pytest.raises(BenchcalError, match=r"KV cache dtype 'fp8' is not supported by llama.cpp \(supported: f32"):
        resolve_kv_dtype("fp8", "llama.cpp")


def test_quantized_cache_is_refused_for_vllm():
    with pytest.raises(BenchcalError, match="not supported by vllm"):
        resolve_kv_dtype("q8_0", "vllm")


@pytest.mark.parametrize(("name", "dtype_id"), [("auto", "f16"), ("float16", "f16"), ("fp8_e4m3", "fp8"),
                                                ("fp8_e5m2", "fp8"), ("Q8_0", "q8_0"), ("bfloat16", "bf16")])
def test_kv_dtype_aliases_resolve(name, dtype_id):
    assert resolve_kv_dtype(name).id == dtype_id


def test_unknown_kv_dtype_suggests_close_names():
    with pytest.raises(BenchcalError, match=r"unknown KV cache dtype 'q8' \(did you mean:"):
        resolve_kv_dtype("q8")


def test_quality_figures_are_the_perplexities_the_cited_ci_logs_print():
    import re
    from pathlib import Path

    from predictor.quants import quality_tier, quant_formats

    folder = Path(__file__).parent / "data" / "imported" / "ggml-ci" / "v100-open-llama-7b-v2-b2755"
    measured = [qf for qf in quant_formats() if qf.quality]
    assert {qf.id for qf in measured} >= {"F16", "Q8_0", "Q4_K_M", "Q2_K"}
    for qf in measured:
        name = qf.quality["source"].rsplit("-tg-", 1)[1]
        text = (folder / name).read_text()
        ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", text).group(1))
        assert qf.quality["perplexity"] == ppl, qf.id
    by_id = {qf.id: qf for qf in measured}
    assert by_id["F16"].perplexity_increase_pct == 0.0
    assert quality_tier(by_id["Q8_0"].perplexity_increase_pct) == "near-lossless"
    assert quality_tier(by_id["Q4_K_M"].perplexity_increase_pct) == "good"
    assert quality_tier(by_id["Q2_K"].perplexity_increase_pct) == "poor" and quality_tier(None) is None


def test_the_matrix_shows_each_formats_quality_with_its_source(capsys):
    import json

    from benchcal.cli import main

    assert main(["matrix", "--model", "qwen2.5-7b", "--gpu", "rtx-4090", "--contexts", "8192", "--format", "json"]) == 0
    rows = {r["quant"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["Q4_K_M"]["quality"]["tier"] == "good" and rows["Q4_K_M"]["quality"]["source"].startswith("https://")
    assert rows["IQ4_XS"]["quality"] is None  # not measured: said, not guessed
    pick = rows["Q4_K_M"]["cheapest_device"]
    assert pick["price_usd"] > 0 and pick["context"] == 8192
    from predictor.estimate import Scenario, predict_scenario
    assert predict_scenario(Scenario("qwen2.5-7b", pick["device"], quant="Q4_K_M", context=8192)).verdict in (
        "fits", "tight")
