"""llama.cpp log importer on real logs of llama.cpp's own CI (ggml-org/ci: llama-cli and llama-perplexity on a
V100, Pythia 2.8B in eleven weight formats; sources in tests/data/imported/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchcal.cli import main
from calibration.importers_llama_log import import_llama_log, parse_run, split_runs
from harness import records
from predictor.errors import BenchcalError

CI = Path(__file__).parent / "data" / "imported" / "ggml-ci"
B4446 = CI / "v100-pythia-2.8b-b4446"


def _runs(path: Path) -> list[dict]:
    return [parse_run(*run) for run in split_runs(path.read_text())]


def test_a_ci_log_holds_a_decode_run_and_a_perplexity_run():
    cli, ppl = _runs(B4446 / "q4_0.log")
    assert (cli["tool"], ppl["tool"]) == ("llama-cli", "llama-perplexity")
    assert (cli["build_number"], cli["build_commit"]) == (4446, "4d2b3d880")
    assert cli["device_name"] == "Tesla V100-PCIE-16GB" and cli["quant"] == "Q4_0"
    assert (cli["eval_ms"], cli["eval_runs"], cli["prompt_tokens"]) == (1618.08, 255, 7)
    assert (cli["n_ctx"], cli["n_ubatch"], cli["flash_attn"], cli["n_gpu_layers"], cli["threads"]) == (
        2048, 512, False, 99, 1)
    assert cli["model_size_bytes"] == round(1.49 * 2**30) and cli["kv_dtype"] == "f16"
    assert (ppl["prompt_eval_ms"], ppl["prompt_tokens"], ppl["n_batch"]) == (2055.00, 8192, 512)
    assert "eval_ms" not in ppl  # perplexity generates nothing ("eval time = 0.00 ms / 1 runs")


def test_a_guessed_file_type_is_read_from_the_tensor_types():
    cli, _ = _runs(B4446 / "f16.log")  # "model ftype = all F32 (guessed)", 130 f16 tensors
    assert cli["quant"] == "F16"
    assert [r["quant"] for r in _runs(B4446 / "q3_k.log")] == ["Q3_K_M", "Q3_K_M"]  # "Q3_K - Medium"


def test_import_writes_a_decode_and_a_prefill_record(tmp_path):
    written, messages = import_llama_log(B4446 / "q2_k.log", model="pythia-2.8b", runs_dir=tmp_path,
                                         source_url="https://example.org/log",
                                         exclude={"prefill": "logits of every token"})
    assert len(written) == 2 and messages == []
    stored = {("decode" if r.record["measurements"].get("decode") else "prefill"): r.record
              for r in records.iter_records(tmp_path)}
    decode, prefill = stored["decode"], stored["prefill"]
    assert decode["config"]["device"] == "v100-pcie-16gb" and decode["config"]["quant"] == "Q2_K"
    point = decode["measurements"]["decode"]
    assert point["decode_tok_s"]["median"] == pytest.approx(255 / 1.82170) and point["context_at_start"] == 7
    assert decode["provenance"]["engine_version"] == "llama.cpp build 4446 (4d2b3d880)"
    assert "excluded_from_fit" not in decode["provenance"]
    assert prefill["measurements"]["prefill"][0]["prompt_tokens"] == 2048 and prefill["config"]["reps"] == 4
    assert prefill["measurements"]["prefill"][0]["prefill_tok_s"]["median"] == pytest.approx(8192 / 2.00233)
    assert prefill["provenance"]["logits_all"] and prefill["provenance"]["excluded_from_fit"]["prefill"]
    again, messages = import_llama_log(B4446 / "q2_k.log", model="pythia-2.8b", runs_dir=tmp_path)
    assert again == [] and all("already imported" in m for m in messages)


def test_a_log_without_a_command_line_or_with_broken_timings_is_refused(tmp_path):
    bad = tmp_path / "x.log"
    bad.write_text("hello\n")
    with pytest.raises(BenchcalError, match="no llama-cli or llama-perplexity command line"):
        import_llama_log(bad, model="pythia-2.8b", runs_dir=tmp_path / "runs")
    text = (B4446 / "q4_0.log").read_text().replace("eval time =    1618.08 ms", "eval time =      -1.00 ms")
    bad.write_text(text)
    with pytest.raises(BenchcalError, match="x.log: run 1: "):
        import_llama_log(bad, model="pythia-2.8b", runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.json"))


def test_the_cli_imports_a_log(tmp_path, capsys):
    assert main(["import", "llama-log", str(B4446 / "q8_0.log"), "--model", "pythia-2.8b",
                 "--runs-dir", str(tmp_path)]) == 0
    assert "imported 2 record(s)" in capsys.readouterr().out
    assert main(["import", "llama-log", str(B4446 / "q8_0.log"), "--model", "nope", "--runs-dir", str(tmp_path)]) == 2


def test_logs_of_early_2024_builds_read_the_same():
    # build 2197: "main: build = 2197 (46fd2737)", ./bin/main and ./bin/perplexity, llama_print_timings lines, no
    # batch or micro-batch line, and the CUDA line that marks the cuBLAS path of quantized prefill
    cli, ppl = _runs(CI / "v100-open-llama-7b-v2-b2197" / "q2_k.log")
    assert (cli["tool"], ppl["tool"]) == ("llama-cli", "llama-perplexity")
    assert (cli["build_number"], cli["build_commit"], cli["quant"]) == (2197, "46fd2737", "Q2_K")
    assert (cli["eval_ms"], cli["eval_runs"], cli["n_ctx"]) == (2578.09, 255, 512)
    assert (ppl["n_ctx"], ppl["n_batch"], ppl["n_ubatch"], ppl["prompt_tokens"]) == (2048, 512, 512, 8192)
    assert cli["quantized_matmul"] == "cublas-fp16" and cli["flash_attn"] is None
    assert _runs(CI / "v100-pythia-2.8b-b4931" / "q4_0.log")[0]["quant"] == "Q4_0"  # print_info: file type


def test_every_shipped_ci_log_imports(tmp_path):
    from calibration.public_data import load_manifest

    entries = [e for e in load_manifest() if e["kind"] == "llama-log"]
    assert len(entries) == 77
    for entry in entries:
        written, _ = import_llama_log(CI.parent / entry["file"], model=entry["model"], runs_dir=tmp_path,
                                      source_url=entry["url"], exclude=entry.get("exclude_from_fit"))
        assert len(written) == 2, entry["file"]


def test_a_perplexity_prefill_is_priced_with_every_tokens_logits(tmp_path):
    """llama-perplexity scores every token: its prefill runs the LM head on all of them (and copies their logits to
    the host from a discrete GPU), which a prompt of the same length does not."""
    from calibration.dataset import load_dataset
    from calibration.features import quantity_features
    from predictor.models import resolve_model
    from predictor.throughput import lm_head_params, prefill_matmul_flops

    arch = resolve_model("pythia-2.8b")
    last, every = prefill_matmul_flops(arch, 2048), prefill_matmul_flops(arch, 2048, logits_all=True)
    assert every - last == pytest.approx(2.0 * lm_head_params(arch) * 2047)
    import_llama_log(B4446 / "q4_0.log", model="pythia-2.8b", runs_dir=tmp_path)
    prefill = load_dataset([tmp_path]).blocks["prefill"]
    assert list(prefill.meta["logits_all"]) == [True]
    as_prompt = quantity_features(prefill.meta.assign(logits_all=False), "prefill")
    compute = "prefill_compute_efficiency"
    assert prefill.features.column(compute)[0] / as_prompt.column(compute)[0] == pytest.approx(every / last)
    assert prefill.features.offset[0] > as_prompt.offset[0]  # the logits over PCIe (pcie_gbs is not fitted)
