"""The serving model: its closed-loop formulas, the fit of the server's terms, and predict --concurrency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.serving import PARAMETERS, _check, fit_overheads
from predictor.load import predict_load, serving_figures
from predictor.scenario import Scenario


def test_one_request_at_a_time_gives_the_same_throughput_at_any_concurrency():
    one = serving_figures("serial", 1, 65, prefill_s=0.04, step1_s=0.005, step_s=0.005)
    four = serving_figures("serial", 4, 65, prefill_s=0.04, step1_s=0.005, step_s=0.005)
    service = 0.04 + 64 * 0.005
    assert one["e2el_ms"] == pytest.approx(1000 * service) and four["e2el_ms"] == pytest.approx(4000 * service)
    assert four["output_tok_s"] == pytest.approx(one["output_tok_s"]) == pytest.approx(65 / service)
    assert four["ttft_ms"] == pytest.approx(1000 * (3 * service + 0.04)) and four["tpot_ms"] == pytest.approx(5.0)
    # a request's own overhead adds to it alone, and hides behind the others' service under load
    alone = serving_figures("serial", 1, 65, 0.04, 0.005, 0.005, request_overhead_ms=30.0)
    loaded = serving_figures("serial", 4, 65, 0.04, 0.005, 0.005, request_overhead_ms=30.0)
    assert alone["e2el_ms"] == pytest.approx(1000 * service + 30.0) and loaded["e2el_ms"] == pytest.approx(4000 * service)


def test_continuous_batching_shares_each_step_between_the_sequences_in_flight():
    one = serving_figures("continuous", 1, 11, prefill_s=0.05, step1_s=0.01, step_s=0.01)
    eight = serving_figures("continuous", 8, 11, prefill_s=0.05, step1_s=0.01, step_s=0.012, seq_overhead_ms=1.0)
    assert one["ttft_ms"] == pytest.approx(50.0) and one["e2el_ms"] == pytest.approx(50.0 + 10 * 10.0)
    assert eight["ttft_ms"] == pytest.approx(8 * 50.0) and eight["tpot_ms"] == pytest.approx(12.0 + 8 * 1.0)
    assert eight["output_tok_s"] == pytest.approx(8 * 11 / (eight["e2el_ms"] / 1000))
    capped = serving_figures("continuous", 8, 11, prefill_s=0.05, step1_s=0.01, step_s=0.012, seq_overhead_ms=1.0,
                             max_num_seqs=4)
    assert capped["tpot_ms"] == pytest.approx(12.0 + 4 * 1.0)
    # eight in flight on four slots: waves of four, each request waiting its turn
    wave = 4 * 50.0 + 10 * (12.0 + 4 * 1.0)
    assert capped["e2el_ms"] == pytest.approx(2 * wave) and capped["ttft_ms"] == pytest.approx(2 * wave - 10 * 16.0)
    assert capped["output_tok_s"] == pytest.approx(4 * 11 / (wave / 1000))
    with pytest.raises(ValueError):
        serving_figures("parallel", 1, 2, 0.1, 0.1, 0.1)


@pytest.mark.parametrize("mode", ["serial", "continuous"])
def test_the_fit_recovers_the_server_terms_that_made_the_figures(mode):
    serial = mode == "serial"  # one request at a time: a per-sequence term or a decode scale is a per-step term
    truth = {"prefill_scale": 1.3, "decode_scale": 1.0, "step_overhead_ms": 2.0,
             "seq_overhead_ms": 0.0 if serial else 1.5, "request_overhead_ms": 7.0}
    levels = []
    for c in (1, 2, 4, 8):
        times = {"prefill_s": 0.03, "step1_s": 0.004, "step_s": 0.004 + 0.0002 * c}
        figures = serving_figures(mode, c, 17, times["prefill_s"], times["step1_s"], times["step_s"], **truth)
        levels.append({"run": "r", "mode": mode, "concurrency": c, "output_tokens": 17, "times": times,
                       "measured": {**{k: figures[k] for k in ("ttft_ms", "tpot_ms", "e2el_ms")},
                                    "output_tok_s": figures["output_tok_s"]}})
    fit = fit_overheads(levels[:3])
    for name in PARAMETERS:  # the scales' weak pull to 1 (SCALE_PRIOR) moves the terms by less than 0.5%
        assert fit[name] == pytest.approx(truth[name], rel=5e-3, abs=1e-3), name
    held_out = _check(levels[3], fit)
    assert abs(held_out["output_tok_s"]["error"]) < 1e-3 and abs(held_out["ttft_p50_ms"]["error"]) < 1e-3


def test_a_server_decoding_faster_than_the_analytical_step_gets_a_decode_scale_below_1():
    # A step that grows linearly with the batch, scaled, is an overhead per step plus one per sequence: the levels
    # cannot tell them apart, and the fit keeps the scale nearest 1 with non-negative overheads. Where the server
    # decodes faster than the analytical step, that is the scale below 1 the measured steps need.
    truth = {"prefill_scale": 0.2, "decode_scale": 0.7, "step_overhead_ms": 0.0, "seq_overhead_ms": 0.5,
             "request_overhead_ms": 3.0}
    levels = []
    for c in (1, 2, 4, 8):
        times = {"prefill_s": 0.05, "step1_s": 0.0074, "step_s": 0.0074 + 0.00001 * c}
        figures = serving_figures("continuous", c, 32, **times, **truth)
        levels.append({"run": "r", "mode": "continuous", "concurrency": c, "output_tokens": 32, "times": times,
                       "measured": figures})
    fit = fit_overheads(levels[:3])
    for name in PARAMETERS:
        assert fit[name] == pytest.approx(truth[name], rel=1e-3, abs=1e-3), name
    assert abs(_check(levels[3], fit)["output_tok_s"]["error"]) < 1e-3


def test_predict_load_names_its_terms_and_their_source():
    load = predict_load(Scenario("llama-3-8b", "rtx-4090", prompt_tokens=512), 4, 128, coefficients=None)
    assert load["mode"] == "serial" and load["overheads"]["source"].startswith("uncalibrated")
    fitted = predict_load(Scenario("qwen2.5-7b", "h100-sxm", engine="vllm", prompt_tokens=512), 8, 128,
                          coefficients=None, overheads={"seq_overhead_ms": 0.5, "source": "fitted from 4 levels"})
    assert fitted["mode"] == "continuous" and fitted["overheads"]["seq_overhead_ms"] == 0.5
    assert fitted["tpot_ms"] == pytest.approx(fitted["step_times_ms"]["step_ms"] + 8 * 0.5, rel=1e-3)


def test_llama_server_batches_its_slots_and_keeps_its_own_fit():
    from predictor.load import serving_key, serving_mode

    assert serving_mode("llama.cpp") == "serial" and serving_mode("llama.cpp", "llama-server") == "continuous"
    assert serving_key("llama.cpp", "llama-server") == "llama-server" and serving_key("llama.cpp") == "llama.cpp"
    assert serving_key("vllm", "vllm") == "vllm"
    scenario = Scenario("llama-3-8b", "rtx-4090", prompt_tokens=512, server="llama-server")
    load = predict_load(scenario, 8, 128, coefficients=None)
    # its default four slots: eight requests in flight decode four at a time
    assert load["mode"] == "continuous" and load["server"] == "llama-server"
    four = predict_load(scenario, 4, 128, coefficients=None)
    assert load["output_tok_s"] == pytest.approx(four["output_tok_s"]) and load["tpot_ms"] == pytest.approx(four["tpot_ms"])
    serial = predict_load(scenario.replace(server=None), 4, 128, coefficients=None)
    assert four["output_tok_s"] > 2 * serial["output_tok_s"]


def test_predict_concurrency_adds_the_load_to_the_json(capsys):
    from benchcal.cli import main

    assert main(["predict", "--model", "qwen2.5-7b", "--gpu", "h100-sxm", "--engine", "vllm", "--concurrency", "16",
                 "--output-tokens", "128", "--prompt", "1024", "--format", "json"]) == 0
    load = json.loads(capsys.readouterr().out)["load"]
    assert load["concurrency"] == 16 and load["output_tokens"] == 128 and load["output_tok_s"] > 0


def test_vllm_batch_budget_sizes_its_profile_run_and_caps_the_running_sequences():
    from predictor.estimate import predict_scenario

    base = Scenario("qwen2.5-7b", "h100-sxm", engine="vllm")
    default = predict_scenario(base, None, launch=False)
    few = predict_scenario(base.replace(max_num_seqs=32), None, launch=False)
    big = predict_scenario(base.replace(max_num_batched_tokens=32768), None, launch=False)
    # fewer sampled rows and a smaller step: less activation memory, a larger pool
    assert few.values["runtime_bytes"] < default.values["runtime_bytes"] < big.values["runtime_bytes"]
    assert few.serving["kv_pool_gib"] > default.serving["kv_pool_gib"] > big.serving["kv_pool_gib"]
    assert default.serving["max_num_seqs"] == 1024  # vllm serve's default on a GPU of 70 GiB or more (not an A100)
    assert few.serving["max_running_sequences"] == 32 < few.serving["max_concurrent_sequences"]
    # the profile run's peak: the larger of its forward pass, tokens x 2 x (3 d_ff + 4 d_model) bytes, and the
    # sampler's warm-up after it, the forward's hidden states (tokens x d_model x 2 bytes) with 1 + 8.6 buffers of
    # max_num_seqs x vocab f32 logits. At 1,024 sequences the sampler sets it at both budgets (the forward of 32,768
    # tokens is 4.3 GiB, the sampler's phase 5.8): the larger budget adds only the hidden states the sampler holds
    from predictor import memory as mem

    arch, copies = default.model, default.coefficients.values["vllm_sampler_copies"]
    assert mem.vllm_forward_bytes(arch, 32768) < mem.vllm_sampler_bytes(arch, 32768, 1024, copies)
    grown = (32768 - 8192) * 2 * arch.hidden_size
    assert big.values["runtime_bytes"] - default.values["runtime_bytes"] == pytest.approx(grown)
    # with few sequences the forward pass sets it: it grows with the budget's tokens
    few_big = predict_scenario(base.replace(max_num_seqs=32, max_num_batched_tokens=32768), None, launch=False)
    scale = default.coefficients.values["compute_buffer_scale"]
    assert few_big.values["runtime_bytes"] - few.values["runtime_bytes"] == pytest.approx(
        scale * (32768 - 8192) * 2 * (3 * arch.intermediate_size + 4 * arch.hidden_size))


def test_requests_arriving_together_at_a_batching_server_give_the_closed_loop_formulas_but_one_step_overhead():
    from predictor.load import simulate_continuous

    def step(b):
        return 0.010 + 0.001 * b

    ttft, e2e = simulate_continuous([0.0] * 4, 5, 0.050, step, step_overhead_s=0.002, seq_overhead_s=0.0005,
                                    request_overhead_s=0.003)
    closed = serving_figures("continuous", 4, 5, 0.050, step(1), step(4), step_overhead_ms=2.0, seq_overhead_ms=0.5,
                             request_overhead_ms=3.0)
    # the simulation prefills the four in one step; the closed loop's formulas take the first alone (vLLM's server
    # does: an idle engine starts a step on the first request to reach it), which costs the others a step overhead
    assert [1000 * t + 2.0 for t in ttft] == pytest.approx([closed["ttft_ms"]] * 4)
    assert [1000 * t + 2.0 for t in e2e] == pytest.approx([closed["e2el_ms"]] * 4)
    alone = serving_figures("continuous", 1, 5, 0.050, step(1), step(1), step_overhead_ms=2.0, request_overhead_ms=3.0)
    assert alone["ttft_ms"] == pytest.approx(50.0 + 2.0 + 3.0)  # one request: one step, no wait


def test_a_batching_server_admits_no_more_sequences_than_its_limit():
    from predictor.load import simulate_continuous

    ttft, e2e = simulate_continuous([0.0] * 3, 3, 0.1, lambda b: 0.01, max_num_seqs=2)
    # two prompts in the first step (0.2 s), two decode steps; the third waits for them, then runs alone
    assert ttft == pytest.approx([0.2, 0.2, 0.2 + 0.02 + 0.1])
    assert e2e == pytest.approx([0.22, 0.22, 0.32 + 0.02])


def test_one_request_at_a_time_at_a_poisson_rate_waits_as_the_md1_queue_says():
    from predictor.load import poisson_offsets, simulate_serial

    service, rate = 0.1, 6.0  # utilization 0.6
    arrivals = poisson_offsets(rate, 40000, seed=1)
    ttft, e2e = simulate_serial(arrivals, service, 0.02)
    waits = [e - service for e in e2e]
    rho = rate * service
    pollaczek_khinchine = rho * service / (2 * (1 - rho))  # mean wait of an M/D/1 queue
    assert sum(waits) / len(waits) == pytest.approx(pollaczek_khinchine, rel=0.05)
    assert min(ttft) == pytest.approx(0.02)  # one that found the server idle: its prefill only


def test_poisson_offsets_are_the_load_generators_draw():
    import random

    from predictor.load import poisson_offsets

    rng = random.Random(7)
    expected = [0.0]
    for _ in range(49):
        expected.append(expected[-1] + rng.expovariate(3.5))
    assert poisson_offsets(3.5, 50, seed=7) == pytest.approx(expected)  # harness.serving.loadgen sends this draw


def test_a_rate_at_or_above_capacity_is_saturated_with_no_latency():
    from predictor.load import rate_figures

    out = rate_figures("serial", 20.0, 10, 0.05, lambda b: 0.01)  # service 0.14 s: capacity 7.1 requests/s
    assert out["saturated"] and out["ttft_ms"] is None and out["capacity_requests_per_s"] == pytest.approx(1 / 0.14, abs=1e-4)
    below = rate_figures("serial", 3.0, 10, 0.05, lambda b: 0.01)
    assert not below["saturated"] and below["tpot_ms"]["p50"] == pytest.approx(10.0)
    assert below["ttft_ms"]["p50"] <= below["ttft_ms"]["p90"] <= below["ttft_ms"]["p99"]
    assert below["request_throughput"] == pytest.approx(3.0, rel=0.1)


def test_predict_request_rate_adds_the_distributions_to_the_json(capsys):
    from benchcal.cli import main

    assert main(["predict", "--model", "qwen2.5-7b", "--gpu", "h100-sxm", "--engine", "vllm", "--request-rate", "2",
                 "--output-tokens", "128", "--prompt", "1024", "--format", "json"]) == 0
    load = json.loads(capsys.readouterr().out)["load"]
    assert load["request_rate"] == 2.0 and not load["saturated"] and load["capacity_requests_per_s"] > 2
    assert set(load["ttft_ms"]) == {"mean", "p50", "p90", "p99"} and load["requests_simulated"] == 1000


@pytest.mark.parametrize("argv", [["--request-rate", "2", "--concurrency", "4"], ["--request-rate", "0"],
                                  ["--request-rate", "nan"], ["--request-rate", "-1"]])
def test_bad_request_rates_are_one_line_and_exit_2(argv):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "benchcal", "predict", "--model", "qwen2.5-7b", "--gpu", "h100-sxm",
                        *argv], capture_output=True, text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_the_most_requests_in_flight_within_a_latency_target():
    from predictor.load import max_concurrency

    s = Scenario("qwen2.5-7b", "h100-sxm", engine="vllm", prompt_tokens=1024)
    loose = max_concurrency(s, 128, max_ttft_ms=2000, max_tpot_ms=50, coefficients=None)
    tight = max_concurrency(s, 128, max_ttft_ms=500, max_tpot_ms=50, coefficients=None)
    assert tight["concurrency"] < loose["concurrency"] <= loose["limit"]
    assert loose["ttft_ms"] <= 2000 and loose["tpot_ms"] <= 50
    # one more request in flight would break the target
    over = predict_load(s, loose["concurrency"] + 1, 128, coefficients=None)
    assert loose["limited_by"] == "running limit" or over["ttft_ms"] > 2000 or over["tpot_ms"] > 50
    assert max_concurrency(s, 128, max_ttft_ms=0.001, coefficients=None) is None


def test_recommend_lists_the_serving_capacity_and_cost_at_a_latency_target(capsys):
    from benchcal.cli import main

    assert main(["recommend", "--model", "llama-3.1-8b", "--ctx", "8192", "--engine", "vllm", "--prompt", "1024",
                 "--max-ttft-ms", "1000", "--max-tpot-ms", "40", "--output-tokens", "128", "--format", "json"]) == 0
    target = json.loads(capsys.readouterr().out)["serving_target"]
    assert target["max_ttft_ms"] == 1000 and target["devices"]
    for row in target["devices"]:
        assert row["concurrency"] >= 1 and row["ttft_ms"] <= 1000 and row["tpot_ms"] <= 40
        if row["cloud_usd_per_hour"]:
            expected = row["cloud_usd_per_hour"] / (row["output_tok_s"] * 3600) * 1e6
            assert row["usd_per_1m_output_tokens"] == pytest.approx(expected, rel=1e-3)


SERVING_RECORDS = Path(__file__).parent / "data" / "serving" / "records"


def test_request_rate_levels_are_predicted_from_the_concurrency_fit_never_fitted():
    from calibration.serving import fit_serving

    fits = fit_serving([SERVING_RECORDS])
    for engine in ("llama.cpp", "vllm"):
        (fit,) = fits[engine].values()
        assert fit["concurrency"] == [1, 2, 4, 8]  # the rate level is not among the fitted levels
        (rate,) = fit["request_rates"]
        assert rate["request_rate"] == 4.0 and rate["requests"] == 16
        for key in ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms"):
            assert rate[key]["measured"] > 0 and rate[key]["predicted"] > 0


def test_report_shows_serving_runs_measured_against_predicted(capsys, tmp_path):
    from benchcal.cli import main

    assert main(["report", "--runs-dir", str(SERVING_RECORDS), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["serving"]
    assert {r["check"] for r in rows} == {"in-sample", "held out", "never fitted"}
    assert {r["engine"] for r in rows} == {"llama.cpp", "vllm"}
    out = tmp_path / "report.html"
    assert main(["report", "--runs-dir", str(SERVING_RECORDS), "--format", "html", "--output", str(out)]) == 0
    assert out.read_text().count("<svg") == 4  # throughput and TTFT against the requests in flight, per engine


def test_report_lists_runs_with_drawn_lengths_as_measured_only(capsys):
    from benchcal.cli import main

    drawn = Path(__file__).parent / "data" / "serving" / "drawn"
    assert main(["report", "--runs-dir", str(drawn), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = data["serving_drawn_lengths"]
    assert row["range_ratio"] == 0.5 and row["concurrency"] == 2 and row["completed"] == 4
    assert row["engine"] == "llama.cpp" and row["output_tok_s"] > 0 and row["ttft_ms"] > 0
    assert "serving" not in data  # no fit: the serving model is of fixed lengths
    assert main(["report", "--runs-dir", str(SERVING_RECORDS), "--format", "json"]) == 0
    assert "serving_drawn_lengths" not in json.loads(capsys.readouterr().out)


def test_predict_html_draws_the_load_curves(tmp_path):
    from benchcal.cli import main

    for flag, value in (("--concurrency", "8"), ("--request-rate", "2")):
        out = tmp_path / f"{flag}.html"
        assert main(["predict", "--model", "qwen2.5-7b", "--gpu", "h100-sxm", "--engine", "vllm", "--prompt", "1024",
                     flag, value, "--format", "html", "--output", str(out)]) == 0
        assert "Serving: " in out.read_text()


IMPORTED_SERVE = Path(__file__).parent / "data" / "imported" / "vllm-bench-serve" / "results.json"
GUIDELLM_CONCURRENT = Path(__file__).parent / "data" / "serving" / "guidellm" / "guidellm-0.3.0-concurrent-1-2-4.json"


def test_imported_request_rate_results_calibrate_their_devices_server_terms(tmp_path):
    from calibration.importers_vllm import import_vllm_bench
    from calibration.serving import fit_serving

    import_vllm_bench(IMPORTED_SERVE, model="llama-3.2-3b", runs_dir=tmp_path, gpu="l40s")
    fit = fit_serving([tmp_path])["vllm"]["l40s"]
    # 10 and 30 requests/s over the file's four decode replicas; the three results sending everything at once are
    # left out (the client and the gateway, not the file, decide how many are in flight)
    assert fit["request_rates_fitted"] == [2.5, 7.5] and fit["levels"] == 6 and fit["concurrency"] == []
    assert "imported" in fit["source"] and fit["mode"] == "continuous"
    assert all(fit[p] >= 0 for p in PARAMETERS) and fit["prefill_scale"] > 0
    results = [json.loads(line) for line in IMPORTED_SERVE.read_text().splitlines()]
    per_gpu = sorted(r["output_throughput"] / 4 for r in results if r["request_rate"] != "inf")
    held = fit["request_rates_held_out"]
    assert {c["request_rate"] for c in held} == {2.5, 7.5}  # each rate predicted by the terms fitted on the other
    assert sorted(c["output_tok_s"]["measured"] for c in held) == pytest.approx(per_gpu)
    for c in held + fit["request_rates"]:
        assert all(c[k]["predicted"] > 0 for k in ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms"))


def test_imported_concurrency_levels_are_fitted_like_the_harness_levels(tmp_path):
    from calibration.importers_guidellm import import_guidellm
    from calibration.serving import fit_serving

    # the device is a label here (the report does not name it): the test is of the levels, not of the GPU
    import_guidellm(GUIDELLM_CONCURRENT, model="smollm2-135m", runs_dir=tmp_path, gpu="rtx-4090", engine="llama.cpp",
                    quant="Q8_0")
    fit = fit_serving([tmp_path])["llama.cpp"]["rtx-4090"]
    assert fit["concurrency"] == [1, 2, 4] and fit["mode"] == "serial" and fit["request_rates"] == []
    assert [c["concurrency"] for c in fit["held_out"]] == [4]  # each report is one run: its highest level held out
    assert fit["seq_overhead_ms"] == 0.0  # one sequence per step: not identifiable


def test_a_batching_servers_step_sizes_the_cache_by_the_sequences_not_the_maximum_context():
    from predictor.load import predict_rate

    base = Scenario(model="llama-3.2-3b", device="l40s", engine="vllm", quant="BF16", context=1263, prompt_tokens=999)
    # 64 sequences x 8,192 tokens would not fit an L40S; 64 x 1,263 does, and that is what vLLM's pool holds
    for context in (8192, 32768):
        wide = base.replace(context=context)
        assert predict_load(wide, 64, 264)["tpot_ms"] == pytest.approx(predict_load(base, 64, 264)["tpot_ms"])
        assert predict_rate(wide, 5.0, 264)["tpot_ms"]["p50"] == pytest.approx(
            predict_rate(base, 5.0, 264)["tpot_ms"]["p50"])


ROUNDS_RECORD = Path(__file__).parent / "data" / "serving" / "rounds" / "vllm-qwen2.5-0.5b-8-rounds.json"


def _level(concurrency, ttfts):
    rounds = [{"completed": 4, "ttft_p50_ms": t, "tpot_p50_ms": 5.0, "e2el_p50_ms": 10 * t, "output_tok_s": 100.0 / t}
              for t in ttfts]
    return {"concurrency": concurrency, "rounds": rounds, "raw": {"ttft_ms": None}}


def test_each_round_is_divided_by_the_drift_its_levels_share():
    from calibration.serving import normalized, round_factors

    levels = [_level(1, [10, 20, 12]), _level(2, [20, 36, 18]), _level(4, [44, 80, 40]), _level(8, [70, 150, 66])]
    # each round's factor: the median over the levels given of the round's figure over the level's median
    factors = round_factors(levels[:3])
    assert factors["ttft_ms"] == pytest.approx([1.0, 1.8, 40 / 44])
    assert factors["output_tok_s"] == pytest.approx([1 / f for f in factors["ttft_ms"]])
    one, _, _, eight = normalized(levels, levels[:3])
    assert one["measured"]["ttft_ms"] == pytest.approx(20 / 1.8)  # 10, 20 / 1.8, 12 x 44 / 40: the middle one
    assert eight["measured"]["ttft_ms"] == pytest.approx(66 * 44 / 40)  # 70, 150 / 1.8, 66 x 44 / 40
    assert eight["measured"]["tpot_ms"] == pytest.approx(5.0)
    # one round, or levels run in different numbers of rounds: nothing shared, the figures stay as they were
    assert round_factors([_level(1, [10]), _level(2, [20])]) is None
    assert round_factors([_level(1, [10, 11]), _level(2, [20, 21, 22])]) is None


def test_the_held_out_level_is_read_with_the_fitted_levels_round_factors_only(tmp_path):
    import numpy as np

    from calibration.serving import ROUND_FIGURES, fit_serving, round_factors, serving_levels

    record = json.loads(ROUNDS_RECORD.read_text())
    levels = [lv for lv in serving_levels([ROUNDS_RECORD.parent]) if lv["concurrency"]]
    factors = round_factors(levels)
    for figure, key in ROUND_FIGURES.items():  # on the real run the rounds' shared drift is much of their spread
        spread = [np.std(np.log([r[key] for r in lv["rounds"]])) for lv in levels]
        left = [np.std(np.log(np.divide([r[key] for r in lv["rounds"]], factors[figure]))) for lv in levels]
        assert np.mean(left) < 0.85 * np.mean(spread)
        for lv in levels:
            assert min(r[key] for r in lv["rounds"]) < lv["measured"][figure] < max(r[key] for r in lv["rounds"])
    before = fit_serving([ROUNDS_RECORD.parent])["vllm"]
    # the held-out level's own rounds, scrambled, change neither the fit nor its reading of the held-out level's
    # figures beyond their own values: the factors come from the fitted levels
    eight = next(lv for lv in record["measurements"]["serving"]["levels"] if lv.get("concurrency") == 8)
    eight["rounds"] = eight["rounds"][::-1]
    (tmp_path / "run.json").write_text(json.dumps(record))
    after = fit_serving([tmp_path])["vllm"]
    ((_, fit_before),), ((_, fit_after),) = before.items(), after.items()
    (b,), (a,) = fit_before["held_out"], fit_after["held_out"]
    assert a["ttft_p50_ms"]["predicted"] == b["ttft_p50_ms"]["predicted"]
    assert a["ttft_p50_ms"]["median_of_rounds"] == b["ttft_p50_ms"]["median_of_rounds"]
    assert a["ttft_p50_ms"]["measured"] != b["ttft_p50_ms"]["measured"]  # its rounds now meet other factors


TIMELINE = Path(__file__).parent / "data" / "serving" / "timeline" / "vllm_cpu_timeline.json"


def test_the_timeline_shows_an_idle_vllm_engine_prefilling_the_first_request_of_a_burst_alone():
    """vLLM's CPU server, sent c requests at once: the engine starts a step on the first request to reach it, and
    the others, arriving while that step runs, are prefilled together in the next (a real run's timeline)."""
    from calibration.serving import first_wave_groups

    data = json.loads(TIMELINE.read_text())
    levels = {level["concurrency"]: level["timeline_ms"] for level in data["levels"] if level["concurrency"]}
    shapes = {c: ["+".join(str(len(g)) for g in first_wave_groups(t, c)) for t in timelines]
              for c, timelines in levels.items()}
    assert shapes[1] == ["1"] * 8
    assert shapes[2] == ["1+1"] * 8
    assert shapes[4].count("1+3") == 6 and shapes[8].count("1+7") == 7
    # the groups hold each request of the wave once (the one that reaches the engine first is not always the one
    # sent first: the wave's sends are microseconds apart)
    for c, timelines in levels.items():
        for timeline in timelines:
            groups = first_wave_groups(timeline, c)
            assert sorted(i for g in groups for i in g) == list(range(c))
    assert first_wave_groups([[0.0, None, None]], 1) is None  # a request with no token: no groups


def test_the_timeline_summary_lists_each_closed_loop_level(tmp_path, capsys):
    from calibration.serving import main

    assert main([str(tmp_path), "--timeline"]) == 1
    assert "no serving run with a request timeline" in capsys.readouterr().out
    data = json.loads(TIMELINE.read_text())
    record = json.loads(ROUNDS_RECORD.read_text())
    for level, kept in zip(record["measurements"]["serving"]["levels"], data["levels"], strict=True):
        level["timeline_ms"] = kept["timeline_ms"]  # the captured timelines in a record of the same sweep
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert main([str(tmp_path), "--timeline"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and "concurrency 8: first wave's groups of first tokens per round 1+7 1+7 1+7 8" in out[3]
