"""``benchcal import vllm-log``: a vLLM server's start-up log on a GPU becomes a record of the KV pool it sized, and
the predicted pool is checked against every such log (none of them is fitted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchcal.cli import main
from calibration.importers_vllm_log import import_vllm_log, parse_settings
from calibration.kvpool import gpu_kv_pool_checks, gpu_pool_summary
from calibration.public_data import DATA_DIR, load_manifest
from predictor.errors import BenchcalError

LOGS = DATA_DIR / "vllm-logs"
LLMD = Path(__file__).parent / "data" / "vllm" / "llm-d"  # llm-d's summaries of its vLLM logs (not imported)
GIB = 2**30


def _entries():
    return [e for e in load_manifest() if e["kind"] == "vllm-log"]


def test_settings_are_read_from_the_log_where_it_prints_them():
    tuned = parse_settings((LOGS / "l40s-qwen3-14b-awq-v0.29.0-tuned-samilazrak.log").read_text())
    assert tuned["vllm_version"] == "0.29.0" and tuned["gpu_memory_utilization"] == 0.95
    assert tuned["max_num_seqs"] == 512 and tuned["max_num_batched_tokens"] == 8192
    assert tuned["max_model_len"] == 40960 and tuned["enforce_eager"] is False
    base = parse_settings((LOGS / "l40s-qwen3-14b-bf16-v0.29.0-base-samilazrak.log").read_text())
    assert base["gpu_memory_utilization"] == 0.92  # "The current --gpu-memory-utilization=0.9200": its default
    t4 = parse_settings((LOGS / "t4-llama-3.2-3b-fp16-v0.8.2-V0-hfcookbook.log").read_text())
    assert t4["gpu_memory_utilization"] == pytest.approx(0.893862645)  # the unrounded figure, not "(0.89)"


def test_every_public_log_imports_as_one_pool_record(tmp_path):
    entries = _entries()
    assert len(entries) >= 10
    for entry in entries:
        written, _ = import_vllm_log(DATA_DIR / entry["file"], model=entry["model"], runs_dir=tmp_path,
                                     gpu=entry["gpu"], quant=entry["quant"], source_url=entry["url"],
                                     **entry["settings"])
        assert len(written) == 1
        record = json.loads(written[0].read_text())
        breakdown = record["memory"]["engine_breakdown"]
        assert breakdown["kv_bytes"] > 0 and breakdown["weights_bytes"] > 0 and "peak_bytes" not in record["memory"]
        assert record["provenance"]["source_url"] == entry["url"] and record["measurements"] == {}
    again, messages = import_vllm_log(DATA_DIR / entries[0]["file"], model=entries[0]["model"], runs_dir=tmp_path,
                                      gpu=entries[0]["gpu"], quant=entries[0]["quant"], **entries[0]["settings"])
    assert again == [] and "already imported" in messages[0]
    checks = gpu_kv_pool_checks([tmp_path], None)
    assert len(checks) == len(entries)
    v0 = [c for c in checks if not c["scored"]]
    assert {c["device"] for c in v0} == {"rtx-3090", "t4"}  # V0 engine logs are listed, not scored


def test_the_predicted_gpu_pool_is_within_10_percent_of_the_logged_pools_at_the_median():
    checks = gpu_kv_pool_checks([Path(__file__).parent.parent / "runs" / "imported"], None)
    summary = gpu_pool_summary(checks)
    assert summary["n"] >= 10 and summary["median_abs_error"] <= 0.10
    # the weights: AWQ and FP8 quantize the linear layers only, their embeddings and LM head stay 16-bit
    for check in checks:
        if check["quant"] in ("AWQ", "FP8"):
            assert check["predicted_weights_gib"] == pytest.approx(check["logged_weights_gib"], rel=0.03)


def test_a_version_before_0_21_leaves_the_cuda_graphs_out_of_the_pool():
    from predictor.eras import kv_pool_counts_cuda_graphs
    from predictor.estimate import predict_scenario
    from predictor.scenario import Scenario

    assert [kv_pool_counts_cuda_graphs("vllm", v) for v in (None, "0.9.2", "0.19.1", "0.21.0", "0.29.0")] == \
        [True, False, False, True, True]
    assert not kv_pool_counts_cuda_graphs("llama.cpp", None)
    base = Scenario(model="qwen3-8b", device="a100-sxm-40gb", engine="vllm", quant="BF16", context=40960,
                    prompt_tokens=64, gpu_memory_utilization=0.9)
    newest = predict_scenario(base, None, launch=False)
    old = predict_scenario(base.replace(engine_build="0.19.1"), None, launch=False)
    graphs = newest.coefficients["vllm_graph_gib"]
    assert old.serving["kv_pool_gib"] == pytest.approx(newest.serving["kv_pool_gib"] + graphs, abs=0.002)
    assert "captured its CUDA graphs after sizing the pool" in old.serving["formula"]
    eager = base.replace(enforce_eager=True)
    assert predict_scenario(eager.replace(engine_build="0.19.1"), None, launch=False).serving["kv_pool_gib"] == \
        predict_scenario(eager, None, launch=False).serving["kv_pool_gib"]
    # the public 0.19.1 log (its graphs captured after the pool, "2.35 GiB estimated") is predicted as 0.19.1 sizes it
    checks = gpu_kv_pool_checks([Path(__file__).parent.parent / "runs" / "imported"], None)
    v019 = [c for c in checks if c["vllm_version"] == "0.19.1" and c["logged_gib"] == pytest.approx(19.36)]
    assert len(v019) == 1 and abs(v019[0]["error"]) <= 0.05


def test_flashinfers_sampler_keeps_no_sort_buffers_in_the_pool():
    from predictor.estimate import predict_scenario
    from predictor.scenario import Scenario

    for name in ("a100-80gb-qwen2-7b-util0.25-dennislee22.log", "a100-80gb-qwen2-7b-util0.5-dennislee22.log"):
        assert parse_settings((LOGS / name).read_text())["sampler"] == "flashinfer"
    assert "sampler" not in parse_settings((LOGS / "l40s-qwen3-14b-awq-v0.29.0-tuned-samilazrak.log").read_text())
    base = Scenario(model="qwen2.5-7b", device="a100-sxm-80gb", engine="vllm", quant="BF16", context=16384,
                    prompt_tokens=64, gpu_memory_utilization=0.25, engine_build="0.10.1")
    sorting = predict_scenario(base, None, launch=False)
    flashinfer = predict_scenario(base.replace(flashinfer_sampler=True), None, launch=False)
    from predictor import memory as mem

    arch, copies = sorting.model, sorting.coefficients["vllm_sampler_copies"]
    fast = max(mem.vllm_forward_bytes(arch, 2048), mem.vllm_sampler_bytes(arch, 2048, 256))  # the A100's budget
    buffers = (mem.vllm_sampler_bytes(arch, 2048, 256, copies) - fast) / GIB
    assert flashinfer.serving["kv_pool_gib"] == pytest.approx(sorting.serving["kv_pool_gib"] + buffers, abs=0.002)
    checks = gpu_kv_pool_checks([Path(__file__).parent.parent / "runs" / "imported"], None)
    logged = {c["logged_gib"]: c for c in checks if c["device"] == "a100-sxm-80gb"}
    assert set(logged) == {5.01, 24.83} and all(abs(c["error"]) <= 0.05 for c in logged.values())


def test_a_device_with_a_logged_cuda_total_sizes_the_pool_from_it():
    from predictor.estimate import predict_scenario
    from predictor.scenario import Scenario

    s = Scenario(model="llama-3.3-70b", device="h100-sxm", engine="vllm", quant="FP8", kv_dtype="fp8", context=32000,
                 prompt_tokens=64, gpu_memory_utilization=0.95, max_num_seqs=8, max_num_batched_tokens=8192)
    est = predict_scenario(s, None, launch=False)
    assert "0.95 x 79.18 GiB (the total CUDA reports)" in est.serving["formula"]
    (check,) = [c for c in gpu_kv_pool_checks([Path(__file__).parent.parent / "runs" / "imported"], None)
                if c["device"] == "h100-sxm"]
    # aihpi's 5.11 GiB: -3.3%. With eight sequences the profile's peak is its forward pass of 8,192 tokens, at the
    # MLP's activation (gate/up output and the activation's output together, 16-bit): 1.81 GiB
    assert abs(check["error"]) <= 0.05
    assert gpu_pool_summary(gpu_kv_pool_checks([Path(__file__).parent.parent / "runs" / "imported"], None))[
        "within_5_percent"] == 10


def test_a_log_without_a_pool_or_a_setting_is_refused_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.log"
    empty.write_text("INFO starting\n")
    with pytest.raises(BenchcalError, match="no KV pool"):
        import_vllm_log(empty, model="llama-3.1-8b", runs_dir=tmp_path / "runs", gpu="h100-sxm")
    bare = tmp_path / "bare.log"
    bare.write_text("Model loading took 14.99 GiB memory and 6.7 seconds\nAvailable KV cache memory: 19.28 GiB\n")
    assert main(["import", "vllm-log", str(bare), "--model", "llama-3.1-8b", "--gpu", "a100-sxm-40gb",
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "gpu_memory_utilization" in err and "--gpu-memory-utilization" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.json"))
    assert main(["import", "vllm-log", str(bare), "--model", "llama-3.1-8b", "--gpu", "a100-sxm-40gb",
                 "--gpu-memory-utilization", "0.9", "--max-model-len", "131072", "--enforce-eager",
                 "--runs-dir", str(tmp_path / "runs")]) == 0
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("*.json")]
    assert record["config"]["engine_options"]["enforce_eager"] is True and record["config"]["context"] == 131072
    assert main(["import", "vllm-log", str(bare), "--model", "llama-3.1-8b", "--gpu", "cpu",
                 "--gpu-memory-utilization", "0.9", "--max-model-len", "8192",
                 "--runs-dir", str(tmp_path / "other")]) == 2


def test_the_sampler_and_device_total_defaults_are_what_the_shipped_logs_say():
    import re
    import statistics

    from harness.engines.vllm.logparse import parse_memory_breakdown
    from predictor import memory as mem
    from predictor.devices import resolve_device
    from predictor.models import resolve_model
    from predictor.registry import ENGINE_DEFAULTS

    buffers = []
    for name, model in (("qwen3-0.6b", "qwen3-0.6b"), ("llama-3.1-8b", "llama-3.1-8b"), ("qwen3-32b", "qwen3-32b")):
        text = (LLMD / f"h100-{name}-bf16-llmd-summary.md").read_text()
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
                if line.startswith("|") and "SUCCESS" in line]
        peak = float(next(row[3] for row in rows if row[7] == "1"))  # one GPU: the peak activation column
        arch = resolve_model(model)
        tokens, seqs = mem.vllm_batch_defaults(resolve_device("h100-sxm"))
        # the sampler's warm-up, after the forward pass, sets the peak: the hidden states it holds, then the buffers
        held = mem.vllm_sampler_bytes(arch, tokens, seqs) - mem.vllm_logits_bytes(arch, seqs)
        assert peak * GIB > mem.vllm_forward_bytes(arch, tokens)
        buffers.append((peak * GIB - held) / mem.vllm_logits_bytes(arch, seqs))
    assert ENGINE_DEFAULTS["vllm"]["vllm_sampler_copies"][0] == pytest.approx(statistics.median(buffers) - 1, abs=0.05)
    shares = []
    for log, device in (("t4-llama-3.2-3b-fp16-v0.8.2-V0-hfcookbook.log", "t4"),
                        ("rtx-3090-llama-3.1-8b-v0-maxlen20k-issue10517.log", "rtx-3090")):
        total = parse_memory_breakdown((LOGS / log).read_text())["device_total_bytes"]
        shares.append(total / GIB / resolve_device(device).memory_gib)
        assert resolve_device(device).cuda_total_gib == pytest.approx(total / GIB, abs=0.005)  # the catalogue's
    llmd = (LLMD / "h100-qwen3-0.6b-bf16-llmd-summary.md").read_text()
    h100 = float(re.search(r"\(([\d.]+) GiB total memory\)", llmd).group(1))
    assert resolve_device("h100-sxm").cuda_total_gib == h100
    shares.append(h100 / resolve_device("h100-sxm").memory_gib)
    assert ENGINE_DEFAULTS["vllm"]["vllm_visible_memory_share"][0] == pytest.approx(statistics.median(shares), abs=0.001)
