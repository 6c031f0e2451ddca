"""llama-bench importer on real public llama-bench output (tests/data/imported, sources in its README)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from calibration.import_schema import LLAMA_BENCH_ROW_SCHEMA, VLLM_RESULT_SCHEMAS, check_llama_bench_row
from calibration.importers import (
    detect_format,
    import_llama_bench,
    parse_llama_bench,
    quant_from_model_type,
)
from calibration.observations import load_observations
from calibration.public_data import load_manifest
from harness import records
from predictor.errors import BenchcalError

DATA = Path(__file__).parent / "data" / "imported"
XD = DATA / "llama3-gpu-benchmarks"
README = DATA / "llama-bench-readme"


def _load(path: Path) -> list[dict]:
    text = path.read_text()
    return parse_llama_bench(text, detect_format(path, text))


def test_markdown_table_rows_become_llama_bench_fields():
    rows = _load(XD / "4090_v3-8b-q4_k_m-cell11.md")
    assert len(rows) == 8
    first, tg = rows[0], rows[4]
    assert (first["n_prompt"], first["n_gen"], first["avg_ts"], first["stddev_ts"]) == (512, 0, 7138.99, 14.96)
    assert (tg["n_prompt"], tg["n_gen"], tg["avg_ts"]) == (0, 512, 130.58)
    assert first["gpu_info"] == "NVIDIA GeForce RTX 4090"
    assert (first["build_commit"], first["build_number"]) == ("4426e298", 2824)
    assert first["model_size"] == round(4.58 * 2**30)
    assert first["n_gpu_layers"] == 99


def test_compact_test_names_parse():
    rows = _load(XD / "H100_PCIe_v3-8b-q4_k_m-cell11.md")
    tests = [(r["n_prompt"], r["n_gen"]) for r in rows]
    assert tests[0] == (512, 0) and tests[4] == (0, 512) and tests[-1] == (512, 128)


@pytest.mark.parametrize("suffix", ["json", "jsonl", "csv"])
def test_machine_formats_give_the_same_rows(suffix):
    rows = _load(README / f"rtx4080-qwen2.5-7b-q4_k_m.{suffix}")
    assert len(rows) == 2
    assert rows[0]["gpu_info"] == "NVIDIA GeForce RTX 4080"
    assert int(rows[0]["n_prompt"]) == 512 and int(rows[1]["n_gen"]) == 128
    assert quant_from_model_type(rows[0]["model_type"]) == "Q4_K_M"
    assert isinstance(rows[0]["n_prompt"], int) and isinstance(rows[0]["avg_ts"], float)  # csv cells read as numbers


def test_every_shipped_llama_bench_file_passes_the_row_schema():
    for schema in (LLAMA_BENCH_ROW_SCHEMA, *VLLM_RESULT_SCHEMAS.values()):
        jsonschema.Draft202012Validator.check_schema(schema)
    checked = 0
    for entry in load_manifest():
        if entry["kind"] == "llama-bench":
            for i, row in enumerate(_load(DATA / entry["file"])):
                check_llama_bench_row(row, entry["file"], i)
                checked += 1
    assert checked > 600


@pytest.mark.parametrize("change,fragment", [
    ({"n_prompt": -512}, "row 1: n_prompt: -512 is less than the minimum of 0"),
    ({"avg_ts": "fast"}, "row 1: avg_ts: 'fast' is not of type 'number'"),
    ({"avg_ts": float("nan")}, "row 1: avg_ts: nan is not a finite number"),
    ({"n_gen": 1.5}, "row 1: n_gen: 1.5 is not of type 'integer'"),
    ({"stddev_ts": -1}, "row 1: stddev_ts: -1 is less than the minimum of 0"),
])
def test_a_row_the_schema_refuses_names_the_file_row_and_field(change, fragment):
    row = {"model_type": "llama 8B Q4_0", "n_prompt": 512, "n_gen": 0, "avg_ts": 100.0, **change}
    with pytest.raises(BenchcalError) as refused:
        check_llama_bench_row(row, "r.json", 0)
    assert str(refused.value) == f"r.json: {fragment}"


def test_quant_names_map_to_catalogue_ids():
    assert quant_from_model_type("llama 8B Q4_K - Medium") == "Q4_K_M"
    assert quant_from_model_type("llama 70B F16") == "F16"
    assert quant_from_model_type("llama 7B mostly Q4_0") == "Q4_0"
    with pytest.raises(BenchcalError):
        quant_from_model_type("llama 7B Q9_Z")


def test_import_writes_decode_and_prefill_records(tmp_path):
    written, messages = import_llama_bench(XD / "4090_v3-8b-q4_k_m-cell11.md", model="llama-3-8b", runs_dir=tmp_path,
                                           source_url="https://example.invalid/source")
    assert len(written) == 8 and not messages
    stored = [s.record for s in records.iter_records(tmp_path)]
    assert {r["config"]["device"] for r in stored} == {"rtx-4090"}
    assert {r["provenance"]["source"] for r in stored} == {"imported"}
    assert {r["provenance"]["imported_from"] for r in stored} == {"4090_v3-8b-q4_k_m-cell11.md"}
    assert {r["provenance"]["engine_commit"] for r in stored} == {"4426e298"}
    obs = load_observations(tmp_path)
    decode = obs.decode.sort_values("gen_tokens")
    assert list(decode["gen_tokens"]) == [512, 1024, 4096, 8192]
    assert list(decode["decode_context"]) == [256.0, 512.0, 2048.0, 4096.0]
    assert decode["decode_tok_s"].iloc[0] == pytest.approx(130.58)
    assert sorted(obs.prefill["prompt_tokens"]) == [512, 1024, 4096, 8192]
    assert not obs.prefill["flash_attn"].any() and set(obs.prefill["n_ubatch"]) == {512}


def test_the_log_says_which_cuda_path_multiplies_quantized_weights(tmp_path):
    # Builds before llama.cpp PR #8075 print "CUDA_USE_TENSOR_CORES: yes": their large-batch matmuls of
    # quantized weights go through an FP16 copy and cuBLAS. Build 5163 prints neither line (MMQ); Metal none.
    import_llama_bench(XD / "4090_v3-8b-q4_k_m-cell11.md", model="llama-3-8b", runs_dir=tmp_path / "old")
    import_llama_bench(README / "rtx4080-qwen2.5-7b-q4_k_m.json", model="qwen2.5-7b", runs_dir=tmp_path / "new")
    import_llama_bench(XD / "M2ultra_192GB-8b-q4_k_m-cell9.md", model="llama-3-8b", runs_dir=tmp_path / "mac",
                       gpu="mac-studio-m2-ultra-192gb")
    paths = {name: {s.record["provenance"].get("quantized_matmul") for s in records.iter_records(tmp_path / name)}
             for name in ("old", "new", "mac")}
    assert paths == {"old": {"cublas-fp16"}, "new": {None}, "mac": {None}}
    assert set(load_observations(tmp_path / "old").prefill["quantized_matmul"]) == {"cublas-fp16"}


def test_json_samples_are_kept(tmp_path):
    import_llama_bench(README / "rtx4080-qwen2.5-7b-q4_k_m.json", model="qwen2.5-7b", runs_dir=tmp_path)
    decode = next(s.record for s in records.iter_records(tmp_path) if s.record["measurements"].get("decode"))
    summary = decode["measurements"]["decode"]["decode_tok_s"]
    assert summary["samples"] == [119.03, 120.178, 119.43, 118.307, 117.464]
    assert summary["median"] == pytest.approx(119.03)
    assert decode["provenance"]["weights_bytes"] == 4677120000


def test_pp_plus_tg_rows_are_skipped_with_a_message(tmp_path):
    written, messages = import_llama_bench(XD / "H100_PCIe_v3-8b-q4_k_m-cell11.md", model="llama-3-8b",
                                           runs_dir=tmp_path)
    assert len(written) == 8
    assert any("pp+tg" in m for m in messages)


def test_importing_twice_adds_nothing(tmp_path):
    file = README / "rtx4080-qwen2.5-7b-q4_k_m.csv"
    assert len(import_llama_bench(file, model="qwen2.5-7b", runs_dir=tmp_path)[0]) == 2
    written, messages = import_llama_bench(file, model="qwen2.5-7b", runs_dir=tmp_path)
    assert written == [] and all("already imported" in m for m in messages)


def test_gpu_is_required_when_the_file_does_not_name_it(tmp_path):
    with pytest.raises(BenchcalError, match="--gpu"):
        import_llama_bench(XD / "M1max_64GB-8b-q4_k_m-cell9.md", model="llama-3-8b", runs_dir=tmp_path)
    written, _ = import_llama_bench(XD / "M1max_64GB-8b-q4_k_m-cell9.md", model="llama-3-8b", runs_dir=tmp_path,
                                    gpu="macbook-pro-m1-max-64gb")
    assert len(written) == 10


def test_a_file_without_llama_bench_results_is_a_user_error(tmp_path):
    for name, text in (("other.csv", "user,uid\nroot,0\n"), ("list.json", "[1, 2]"), ("obj.jsonl", '{"a": 1}\n')):
        (tmp_path / name).write_text(text)
        with pytest.raises(BenchcalError, match="no llama-bench results found"):
            import_llama_bench(tmp_path / name, model="llama-3-8b", runs_dir=tmp_path / "runs", gpu="rtx-4090")


def test_unknown_model_and_missing_file_are_user_errors(tmp_path):
    with pytest.raises(BenchcalError, match="unknown model"):
        import_llama_bench(README / "rtx4080-qwen2.5-7b-q4_k_m.json", model="no-such-model", runs_dir=tmp_path)
    with pytest.raises(BenchcalError, match="not found"):
        import_llama_bench(tmp_path / "missing.md", model="llama-3-8b", runs_dir=tmp_path)


def test_manifest_covers_every_file_with_a_url():
    entries = load_manifest()
    files = {e["file"] for e in entries}
    on_disk = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name not in ("README.md",
                                                                                                   "sources.json")}
    assert files == on_disk
    assert all(e["url"].startswith("https://github.com/") for e in entries)


def test_depth_rows_of_llama_cpps_own_benches(tmp_path):
    # benches/dgx-spark.md: flash attention on, n_ubatch 2048, each test repeated "@ d<depth>".
    file = DATA / "llama-cpp-benches" / "dgx-spark-qwen2.5-coder-7b-q8_0.md"
    rows = _load(file)
    assert len(rows) == 10
    last = rows[-1]
    assert (last["n_prompt"], last["n_gen"], last["n_depth"], last["avg_ts"]) == (0, 32, 32768, 22.70)
    assert (last["flash_attn"], last["n_ubatch"], last["build_number"]) == (True, 2048, 6918)
    written, _ = import_llama_bench(file, model="qwen2.5-7b", runs_dir=tmp_path, gpu="dgx-spark")
    assert len(written) == 10
    obs = load_observations(tmp_path)
    assert sorted(obs.decode["decode_context"]) == [16.0, 4112.0, 8208.0, 16400.0, 32784.0]
    prefill = obs.prefill.set_index("context")
    # a prompt after tokens already in the cache is fitted like one from an empty cache, with its depth
    assert sorted(prefill["prompt_depth"]) == [0, 4096, 8192, 16384, 32768]
    assert not any(isinstance(reason, str) for reason in prefill["exclude_reason"])


def test_tables_pasted_into_issue_threads(tmp_path):
    # apple-silicon/: a build line without its colon, a commit named as "`llama.cpp`(@sha)", and the
    # repetitions of the llama-bench command pasted above the table ("-r 2").
    apple = DATA / "apple-silicon"
    tiny = _load(apple / "m1-ultra-tinyllama-1.1b-q4_k_m.md")
    assert [(r["n_prompt"], r["n_gen"]) for r in tiny] == [(512, 0), (4096, 0), (0, 128), (4096, 128)]
    assert (tiny[2]["avg_ts"], tiny[2]["build_commit"], tiny[2]["build_number"]) == (242.56, "e9fd8dc", 7825)
    assert tiny[0]["model_size"] == round(636.18 * 2**20) and "flash_attn" not in tiny[0]
    moe = _load(apple / "m1-ultra-qwen3-235b-a22b-iq4_xs.md")
    assert [r["avg_ts"] for r in moe] == [148.58, 18.30]
    assert (moe[0]["build_commit"], moe[0]["build_number"]) == ("ca0ef2dddb022cb1337d775cd05cd27d7808aff4", None)
    assert quant_from_model_type(moe[0]["model_type"]) == "IQ4_XS"
    m3 = _load(apple / "m3-ultra-llama-3.3-70b-q4_k_m.md")
    assert {r["repetitions"] for r in m3} == {2} and all(r["flash_attn"] for r in m3)
    written, _ = import_llama_bench(apple / "m1-ultra-qwen3-235b-a22b-iq4_xs.md", model="qwen3-235b-a22b",
                                    runs_dir=tmp_path, gpu="mac-studio-m1-ultra-128gb")
    versions = {json.loads(p.read_text())["provenance"]["engine_version"] for p in written}
    assert versions == {"llama.cpp commit ca0ef2ddd"}
    written, _ = import_llama_bench(apple / "m3-ultra-llama-3.3-70b-q4_k_m.md", model="llama-3.3-70b",
                                    runs_dir=tmp_path, gpu="mac-studio-m3-ultra-512gb")
    assert len(written) == 3 and {json.loads(p.read_text())["config"]["reps"] for p in written} == {2}


def test_catalogue_plan_matches_the_sizes_llama_bench_printed_for_the_apple_files():
    # The tensor plan of each model reproduces the size column of its file (markdown rounds to 0.01 GiB/MiB).
    from predictor.models import resolve_model
    from predictor.quants import resolve_quant
    from predictor.weights import known_weights_bytes

    for name, model, quant, size in (("m1-ultra-tinyllama-1.1b-q4_k_m.md", "tinyllama-1.1b", "Q4_K_M", 636.18 * 2**20),
                                     ("m1-ultra-llama-3.2-3b-q4_k_m.md", "llama-3.2-3b", "Q4_K_M", 1.87 * 2**30),
                                     ("m3-ultra-llama-3.3-70b-q4_k_m.md", "llama-3.3-70b", "Q4_K_M", 39.59 * 2**30)):
        planned, source = known_weights_bytes(resolve_model(model), resolve_quant(quant), "llama.cpp")
        assert source == "llama-quantize tensor types", name
        assert planned == pytest.approx(size, rel=0.005), name


IMPORTER = """
import sys
from calibration.importers import import_llama_bench
import_llama_bench(sys.argv[1], model="llama-3-8b", runs_dir=sys.argv[2])
"""


def test_parallel_imports_of_one_file_store_what_one_import_stores(tmp_path):
    import subprocess
    import sys

    source = XD / "4090_v3-8b-q4_k_m-cell11.md"
    once, _ = import_llama_bench(source, model="llama-3-8b", runs_dir=tmp_path / "once")
    root = tmp_path / "parallel"
    importers = [subprocess.Popen([sys.executable, "-c", IMPORTER, str(source), str(root)]) for _ in range(8)]
    assert all(p.wait(timeout=300) == 0 for p in importers)
    stored = [s.record for s in records.iter_records(root)]
    keys = [r["provenance"]["import_key"] for r in stored]
    assert len(stored) == len(once) == 8 and len(set(keys)) == 8  # no duplicate, none lost
    assert not [p for p in root.rglob("*") if p.is_file() and p.suffix != ".json"]  # the lock lives elsewhere


def test_a_compare_llama_bench_table_imports_its_baseline_column(tmp_path):
    file = DATA / "llama-cpp-prs" / "rtx-3090-llama-7b-f16-q2_k-q3_k_s-q4_0-pr4766.md"
    rows = _load(file)
    assert len(rows) == 9 and all(r["compare_column"] == "t/s master" and r["stddev_ts"] is None for r in rows)
    q2k = next(r for r in rows if r["model_type"] == "llama 7B Q2_K" and r["n_gen"] == 128)
    assert q2k["avg_ts"] == 92.69 and q2k["gpu_info"] == "RTX 3090"  # master's figure, not the branch's 91.62
    written, _ = import_llama_bench(file, model="llama-2-7b", runs_dir=tmp_path, gpu="rtx-3090",
                                    exclude={"prefill": "not stated"})
    obs = load_observations(tmp_path)
    assert sorted(obs.decode["quant"]) == ["F16", "Q2_K", "Q3_K_S", "Q4_0"]
    assert obs.prefill["exclude_reason"].notna().all()
    records = [json.loads(p.read_text()) for p in written]
    assert {r["provenance"]["import_format"] for r in records} == {"compare-llama-bench md (its baseline column)"}
    assert all(r["provenance"]["engine_version"] is None for r in records)  # the table names no build


def test_compare_rows_that_change_the_test_settings_are_skipped():
    # rows of the table in ggml-org/llama.cpp PR #5351 (RTX 3090, llama-bench -b 1..8): not the default test
    text = ("| GPU        | Model             |     Batch size | Test     |     t/s master |     t/s PR |     Speedup |\n"
            "| :--------- | :---------------- | -------------: | :------- | -------------: | ---------: | ----------: |\n"
            "| RTX 3090   | llama 7B Q2_K_M   |              1 | pp512    |         103.75 |     102.80 |        0.99 |\n"
            "| RTX 3090   | llama 7B Q2_K_M   |              2 | pp512    |          99.39 |     177.01 |        1.78 |\n")
    assert parse_llama_bench(text, "md") == []
