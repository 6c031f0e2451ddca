"""A corpus of bad input across every command: each case must end with exit code 2 and one ``benchcal: error:``
line, no traceback, nothing measured, and the runs directory byte-identical.

Cases are built from: bad ids (model, device, engine, quant, KV type, format, build), numbers of every kind (zero,
negative, NaN, infinite, huge, words) for every numeric option, malformed and hostile files of every format the
commands read (config.json, GGUF, sweep TOML, llama-bench and vLLM results, coefficient tables, thresholds), and
path oddities (missing, a file where a folder goes, a folder where a file goes).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from benchcal.cli import main

BAD_NUMBERS = ["0", "-1", "nan", "inf", "abc", "1e400"]


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _write(tmp: Path, name: str, content: str | bytes) -> str:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def _config(**changes) -> str:
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
            "vocab_size": 1024, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}
    base.update(changes)
    return json.dumps(base, allow_nan=True)


# (name, argv with {tmp} and {runs} placeholders, files to create: name -> content)
CASES: list[tuple[str, list[str], dict[str, str | bytes]]] = []


def case(name: str, argv: list[str], files: dict[str, str | bytes] | None = None) -> None:
    CASES.append((name, argv, files or {}))


P = ["predict", "--model", "llama-3-8b", "--gpu", "rtx-4090"]
for flag in ("--ctx", "--prompt", "--batch", "--gpus", "--n-ubatch", "--host-bw-gbs", "--host-mem-gib",
             "--gpu-memory-utilization", "--concurrency", "--output-tokens", "--cpu-bw-gbs", "--cpu-tflops"):
    for value in BAD_NUMBERS:
        case(f"predict {flag} {value}", [*P, flag, value])
for value in ("-0.5", "1.5", "nan", "abc"):
    case(f"predict --offload {value}", [*P, "--offload", value])
case("predict --ctx above the model's maximum", [*P, "--ctx", "99999999"])
case("predict --prompt above --ctx", [*P, "--ctx", "1024", "--prompt", "2048"])
case("predict --server without a load", [*P, "--server", "llama-server"])
case("predict --server of another engine", [*P, "--server", "vllm", "--concurrency", "4"])
case("predict --server unknown", [*P, "--server", "ollama", "--concurrency", "4"])
case("predict --prompt-depth + --prompt above --ctx", [*P, "--ctx", "4096", "--prompt", "512", "--prompt-depth", "4000"])
for value in ("-1", "abc", "1.5"):
    case(f"predict --prompt-depth {value}", [*P, "--prompt-depth", value])
for name, argv in [
    ("unknown model", ["predict", "--model", "llama-9-9b", "--gpu", "rtx-4090"]),
    ("empty model", ["predict", "--model", "", "--gpu", "rtx-4090"]),
    ("unknown gpu", ["predict", "--model", "llama-3-8b", "--gpu", "rtx-9090"]),
    ("empty gpu", ["predict", "--model", "llama-3-8b", "--gpu", ""]),
    ("unknown quant", [*P, "--quant", "Q9_K"]),
    ("vllm quant on llama.cpp", [*P, "--quant", "AWQ"]),
    ("unknown kv dtype", [*P, "--kv-dtype", "zz"]),
    ("unknown engine", [*P, "--engine", "tgi"]),
    ("unknown format", [*P, "--format", "pdf"]),
    ("bad engine build", [*P, "--engine-build", "banana"]),
    ("negative engine build", [*P, "--engine-build", "-5"]),
    ("tensor parallel on a unified device", ["predict", "--model", "llama-3-8b", "--gpu", "dgx-spark", "--gpus", "2"]),
    ("quantized KV cache without flash attention", [*P, "--kv-dtype", "q8_0", "--no-flash-attn"]),
    ("tensor parallel size vLLM refuses", ["predict", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--engine", "vllm",
                                           "--gpus", "3"]),
    ("missing coefficients", [*P, "--coefficients", "{tmp}/missing.json"]),
    ("coefficients is a folder", [*P, "--coefficients", "{tmp}"]),
]:
    case(f"predict {name}", argv)
case("predict binary coefficients", [*P, "--coefficients", "{tmp}/bin.json"], {"bin.json": b"\x00\xff\xfe" * 50})
case("predict coefficients not JSON", [*P, "--coefficients", "{tmp}/c.json"], {"c.json": "{engines: "})
case("predict coefficients without engines", [*P, "--coefficients", "{tmp}/c.json"], {"c.json": "[1, 2]"})
case("predict output into a missing folder", [*P, "-o", "{tmp}/missing/dir/x.json"])
case("predict output is a folder", [*P, "-o", "{tmp}"])

# a model given as a config.json path
for name, cfg in [
    ("zero heads", _config(num_attention_heads=0)), ("negative layers", _config(num_hidden_layers=-2)),
    ("layers as a word", _config(num_hidden_layers="thirty")), ("NaN hidden size", _config(hidden_size=math.nan)),
    ("infinite vocabulary", _config(vocab_size=math.inf)), ("huge hidden size", _config(hidden_size=1e30)),
    ("no architecture", json.dumps({"hidden_size": 256})), ("a list", "[1, 2, 3]"), ("truncated", _config()[:40]),
    ("empty", ""), ("heads not dividing hidden", _config(num_attention_heads=3)),
]:
    case(f"config.json {name}", ["predict", "--model", "{tmp}/m/config.json", "--gpu", "rtx-4090"],
         {"m/config.json": cfg})
case("config.json binary", ["predict", "--model", "{tmp}/m/config.json", "--gpu", "rtx-4090"],
     {"m/config.json": b"\x89PNG\r\n\x1a\n" + b"\x00" * 64})
for name, blob in [("garbage", b"not a gguf at all" * 8), ("truncated header", b"GGUF\x03\x00\x00\x00" + b"\x00" * 7),
                   ("absurd counts", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16), ("empty", b"")]:
    case(f"gguf {name}", ["predict", "--model", "{tmp}/m.gguf", "--gpu", "rtx-4090"], {"m.gguf": blob})

L = ["leaderboard", "--model", "llama-3-8b"]
for flag in ("--ctx", "--prompt", "--batch"):
    for value in ("0", "-3", "nan", "x"):
        case(f"leaderboard {flag} {value}", [*L, flag, value])
case("leaderboard unknown quant", [*L, "--quant", "Q1_Z"])
case("leaderboard unknown model", ["leaderboard", "--model", "nope"])
M = ["matrix", "--model", "llama-3-8b", "--gpu", "rtx-4090"]
for value in ("", ",", "-1,0", "abc", "4096,nan", "1e400"):
    case(f"matrix --contexts {value!r}", [*M, "--contexts", value])
for value in ("0", "-2", "nan"):
    case(f"matrix --gpus {value}", [*M, "--gpus", value])
R = ["recommend", "--model", "llama-3-8b", "--ctx", "8192"]
for flag, values in (("--min-decode", ("-5", "inf", "nan", "x")), ("--budget", ("-1", "0", "nan", "inf"))):
    for value in values:
        case(f"recommend {flag} {value}", [*R, flag, value])
case("recommend unknown model", ["recommend", "--model", "nope", "--ctx", "8192"])
FT = ["finetune", "--model", "llama-3-8b"]
for flag in ("--seq", "--batch", "--lora-rank", "--gpus"):
    for value in BAD_NUMBERS:
        case(f"finetune {flag} {value}", [*FT, flag, value])
for name, extra in [("unknown method", ["--method", "dora"]), ("unknown optimizer", ["--method", "lora", "--optimizer", "lion"]),
                    ("unknown adapter dtype", ["--adapter-dtype", "fp8"]), ("cpu", ["--gpu", "cpu"]),
                    ("unknown gpu", ["--gpu", "rtx-9090"])]:
    case(f"finetune {name}", [*FT, *extra])
case("finetune unknown model", ["finetune", "--model", "nope"])
CO = ["cost", "--model", "llama-3-8b", "--gpu", "rtx-4090"]
for flag in ("--ctx", "--prompt", "--concurrency", "--output-tokens", "--hours-per-day"):
    for value in BAD_NUMBERS:
        case(f"cost {flag} {value}", [*CO, flag, value])
for flag in ("--usd-per-kwh", "--input-per-output"):
    for value in ("-1", "nan", "inf", "abc"):
        case(f"cost {flag} {value}", [*CO, flag, value])
for name, extra in [("a day of 25 hours", ["--hours-per-day", "25"]), ("prompt beyond the context", ["--prompt", "9000"]),
                    ("unknown engine", ["--engine", "tgi"]), ("unknown quant", ["--quant", "Q1_Z"])]:
    case(f"cost {name}", [*CO, *extra])
case("cost cpu", ["cost", "--model", "llama-3-8b", "--gpu", "cpu"])
case("cost unknown gpu", ["cost", "--model", "llama-3-8b", "--gpu", "rtx-9090"])

B = ["bench", "--gpu", "cpu", "--model", "smollm2-135m", "--runs-dir", "{runs}"]
for flag in ("--ctx", "--reps", "--timeout", "--threads", "--requests"):
    for value in ("0", "-1", "nan", "x"):
        case(f"bench {flag} {value}", [*B, flag, value])
for value in ("-1", "x"):
    case(f"bench --gen {value}", [*B, "--gen", value])
    case(f"bench --warmup {value}", [*B, "--warmup", value])
for name, argv in [
    ("ctx above the model's maximum", [*B, "--ctx", "99999"]),
    ("prompt as words", [*B, "--prompt", "a,b"]),
    ("prompt zero", [*B, "--prompt", "0"]),
    ("prompt above ctx", [*B, "--ctx", "256", "--prompt", "512"]),
    ("unknown kv dtype", [*B, "--kv-dtype", "zz"]),
    ("unknown quant", [*B, "--quant", "Q9_K"]),
    ("unknown engine", [*B, "--engine", "llama.cp"]),
    ("unknown model", ["bench", "--gpu", "cpu", "--model", "smollm9", "--runs-dir", "{runs}"]),
    ("unknown gpu", ["bench", "--gpu", "rtx-9090", "--model", "smollm2-135m", "--runs-dir", "{runs}"]),
    ("override not a number", [*B, "--override", "num_layers=abc"]),
    ("override unknown key", [*B, "--override", "wings=2"]),
    ("override without a value", [*B, "--override", "num_layers"]),
    ("missing weights", [*B, "--weights", "{tmp}/missing.gguf"]),
    ("concurrency without --serve", [*B, "--concurrency", "2"]),
    ("serve with zero concurrency", [*B, "--serve", "--concurrency", "0"]),
    ("serve with words", [*B, "--serve", "--concurrency", "a"]),
    ("serve with a bad rate", [*B, "--serve", "--request-rate", "-2"]),
    ("serve with zero rounds", [*B, "--serve", "--rounds", "0"]),
    ("rounds without --serve", [*B, "--rounds", "3"]),
    ("range ratio without --serve", [*B, "--range-ratio", "0.5"]),
    ("serve with a range ratio of 1", [*B, "--serve", "--range-ratio", "1"]),
    ("serve with a range ratio a word", [*B, "--serve", "--range-ratio", "wide"]),
    ("server without --serve", [*B, "--server", "llama-server"]),
    ("serve with another engine's server", [*B, "--serve", "--server", "vllm"]),
    ("serve an engine without a server", [*B, "--serve", "--engine", "transformers"]),
    ("quantized KV cache without flash attention", [*B, "--kv-dtype", "q4_0"]),
    ("endpoint without --serve", [*B, "--endpoint", "http://127.0.0.1:8000/v1"]),
    ("endpoint plain http to another host", [*B, "--serve", "--endpoint", "http://10.9.8.7:8000/v1"]),
    ("endpoint with credentials", [*B, "--serve", "--endpoint", "https://u:pw@gpu.example/v1"]),
    ("endpoint not an API base", [*B, "--serve", "--endpoint", "https://gpu.example/"]),
    ("endpoint key variable unset", [*B, "--serve", "--endpoint", "http://127.0.0.1:8000/v1", "--api-key-env",
                                     "BENCHCAL_NO_SUCH_KEY"]),
    ("endpoint on another host without a gpu", ["bench", "--serve", "--endpoint", "https://gpu.example/v1", "--model",
                                                "smollm2-135m", "--runs-dir", "{runs}"]),
    ("endpoint with a server to start", [*B, "--serve", "--endpoint", "http://127.0.0.1:8000/v1", "--server",
                                         "llama-server"]),
    ("endpoint nothing answers", [*B, "--serve", "--endpoint", "http://127.0.0.1:1/v1"]),
    ("missing sweep", ["bench", "--gpu", "cpu", "--sweep", "{tmp}/missing.toml", "--runs-dir", "{runs}"]),
    ("runs dir is a file", ["bench", "--gpu", "cpu", "--model", "smollm2-135m", "--runs-dir", "{tmp}/afile"]),
]:
    case(f"bench {name}", argv, {"afile": "x"} if "afile" in " ".join(argv) else None)
case("bench garbage gguf", [*B, "--weights", "{tmp}/w.gguf"], {"w.gguf": b"\x00" * 300})
S = ["bench", "--gpu", "cpu", "--sweep", "{tmp}/s.toml", "--runs-dir", "{runs}"]
for name, text in [
    ("binary", b"\xff\xfe\x00\x01" * 40),
    ("not TOML", "name = \n[[configs"),
    ("context a word", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\ncontext = "big"\n'),
    ("configs a string", 'name = "x"\nconfigs = "x"\n'),
    ("no configs", 'name = "x"\n'),
    ("negative timeout", 'name = "x"\ntimeout_s = -5\n[[configs]]\nmodel = "smollm2-135m"\n'),
    ("unknown model", 'name = "x"\n[[configs]]\nmodel = "nope-1b"\n'),
    ("reps zero", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\nreps = 0\n'),
    ("prompt list of words", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\nprompt_tokens = ["a"]\n'),
    ("engine options not a table", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\nengine_options = 3\n'),
    ("serve not a table", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\nserve = 4\n'),
    ("trust remote code", 'name = "x"\n[[configs]]\nmodel = "qwen2.5-0.5b"\nengine = "vllm"\n'
                          'engine_options = { trust_remote_code = true }\n'),
    ("engine option misspelt", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\n'
                               'engine_options = { n_gpu_layrs = 5 }\n'),
    ("vllm option on llama.cpp", 'name = "x"\n[[configs]]\nmodel = "smollm2-135m"\n'
                                 'engine_options = { kv_pool = "profiled" }\n'),
    ("llama.cpp option on vllm", 'name = "x"\n[[configs]]\nmodel = "qwen2.5-0.5b"\nengine = "vllm"\n'
                                 'engine_options = { n_ubatch = 64 }\n'),
]:
    case(f"sweep {name}", S, {"s.toml": text})

for command in (["runs"], ["calibrate"], ["report"], ["check"]):
    case(f"{command[0]} missing runs dir", [*command, "--runs-dir", "{tmp}/missing"])
    case(f"{command[0]} runs dir is a file", [*command, "--runs-dir", "{tmp}/afile"], {"afile": "x"})
for value in ("-1", "x", "nan"):
    case(f"calibrate --bootstrap {value}", ["calibrate", "--runs-dir", "runs", "--bootstrap", value])
case("calibrate --out is a file", ["calibrate", "--runs-dir", "runs", "--out", "{tmp}/afile", "--bootstrap", "0"],
     {"afile": "x"})
case("report output into a missing folder", ["report", "--runs-dir", "runs", "-o", "{tmp}/missing/r.md"])
case("report unknown format", ["report", "--runs-dir", "runs", "--format", "pdf"])
case("check missing thresholds", ["check", "--thresholds", "{tmp}/missing.toml"])
case("check binary thresholds", ["check", "--thresholds", "{tmp}/t.toml"], {"t.toml": b"\x00\xff" * 30})

LB = ["import", "llama-bench"]
for name, content in [("empty", ""), ("binary", b"\x00\xff\xfe\xfd" * 30), ("not a table", "hello world\n"),
                      ("json of the wrong shape", '{"a": 1}'),
                      ("negative prompt", '[{"model_type": "llama 8B Q4_0", "n_prompt": -512, "n_gen": 0, '
                                          '"avg_ts": 100.0, "stddev_ts": 1.0}]')]:
    ext = ".json" if isinstance(content, str) and content.startswith(("{", "[")) else ".md"
    case(f"import llama-bench {name}", [*LB, "{tmp}/r" + ext, "--model", "llama-3-8b", "--gpu", "rtx-4090",
                                         "--runs-dir", "{runs}"], {"r" + ext: content})
_ROW = {"model_type": "llama 8B Q4_0", "n_prompt": 512, "n_gen": 0, "stddev_ts": 1.0, "avg_ts": 10}
for name, change in [("speed as text", {"avg_ts": "fast"}), ("zero speed", {"avg_ts": 0}),
                     ("fractional tokens", {"n_prompt": 0, "n_gen": 1.5}), ("negative size", {"model_size": -1}),
                     ("no model type", {"model_type": None}), ("negative samples", {"samples_ts": [10, -1]}),
                     ("zero threads", {"n_threads": 0})]:
    content = json.dumps([{k: v for k, v in {**_ROW, **change}.items() if v is not None}])
    case(f"import llama-bench {name}", [*LB, "{tmp}/r.json", "--model", "llama-3-8b", "--gpu", "rtx-4090",
                                         "--runs-dir", "{runs}"], {"r.json": content})
case("import llama-bench csv with a word for a count",
     [*LB, "{tmp}/r.csv", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--runs-dir", "{runs}"],
     {"r.csv": "model_type,n_prompt,n_gen,avg_ts\nllama 8B Q4_0,many,0,100.5\n"})
case("import llama-bench csv with an empty speed",
     [*LB, "{tmp}/r.csv", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--runs-dir", "{runs}"],
     {"r.csv": "model_type,n_prompt,n_gen,avg_ts\nllama 8B Q4_0,512,0,\n"})
case("import llama-bench missing file", [*LB, "{tmp}/missing.md", "--model", "llama-3-8b", "--runs-dir", "{runs}"])
case("import llama-bench a folder", [*LB, "{tmp}", "--model", "llama-3-8b", "--runs-dir", "{runs}"])
case("import llama-bench unknown model", [*LB, "{tmp}/r.md", "--model", "nope", "--runs-dir", "{runs}"],
     {"r.md": "| model | size | params | backend | ngl | test | t/s |\n"})
V = ["import", "vllm-bench"]
for name, content in [("empty", ""), ("binary", b"\x00\x01" * 50), ("not JSON", "{x"),
                      ("no known keys", '{"hello": 1}'), ("a number", "42")]:
    case(f"import vllm-bench {name}", [*V, "{tmp}/v.json", "--model", "llama-3.2-3b", "--gpu", "l40s",
                                        "--runs-dir", "{runs}"], {"v.json": content})
for name, content in [("negative TPOT", '{"median_tpot_ms": -3, "mean_ttft_ms": 10}'),
                      ("zero concurrency", '{"median_tpot_ms": 10, "max_concurrency": 0}'),
                      ("completed as text", '{"median_tpot_ms": 10, "completed": "ten"}'),
                      ("negative rate", '{"median_tpot_ms": 10, "request_rate": -1}'),
                      ("infinite TTFT", '{"median_tpot_ms": 10, "mean_ttft_ms": Infinity}'),
                      ("latency of nothing", '{"latencies": []}'),
                      ("negative latency", '{"avg_latency": -0.5}'),
                      ("zero throughput", '{"tokens_per_second": 0}')]:
    case(f"import vllm-bench {name}", [*V, "{tmp}/v.json", "--model", "llama-3.2-3b", "--gpu", "l40s",
                                        "--input-len", "128", "--output-len", "16", "--runs-dir", "{runs}"],
         {"v.json": content})
case("import vllm-bench unknown gpu", [*V, "{tmp}/v.json", "--model", "llama-3.2-3b", "--gpu", "rtx-9090",
                                        "--runs-dir", "{runs}"], {"v.json": '{"median_tpot_ms": 10}'})
case("import unknown kind", ["import", "sglang-bench", "{tmp}/x.json", "--model", "llama-3-8b"])
G = ["import", "guidellm"]
for name, content in [("not json", "benchmarks: none"), ("no benchmarks", '{"results": []}'),
                      ("empty benchmarks", '{"benchmarks": []}'),
                      ("no strategy", '{"benchmarks": [{"metrics": {}}]}'),
                      ("a throughput sweep", '{"benchmarks": [{"args": {"strategy": {"type_": "throughput"}}}]}'),
                      ("no successful request", '{"benchmarks": [{"args": {"strategy": {"type_": "synchronous"}}, '
                                                '"request_totals": {"successful": 0}}]}')]:
    case(f"import guidellm {name}", [*G, "{tmp}/g.json", "--model", "llama-3.2-3b", "--gpu", "l40s",
                                      "--runs-dir", "{runs}"], {"g.json": content})
case("import guidellm without a gpu", [*G, "{tmp}/g.json", "--model", "llama-3.2-3b", "--runs-dir", "{runs}"],
     {"g.json": '{"benchmarks": []}'})
case("import guidellm unknown engine", [*G, "{tmp}/g.json", "--model", "llama-3.2-3b", "--gpu", "l40s",
                                         "--engine", "sglang", "--runs-dir", "{runs}"], {"g.json": '{"benchmarks": []}'})


def test_the_corpus_is_large():
    assert len(CASES) >= 150


@pytest.fixture
def guarded(monkeypatch):
    """Nothing may be measured: a case that reaches a run fails the test instead of running an engine."""
    from harness import protocol
    from harness.serving import run as serving_run

    def refuse(*args, **kwargs):
        raise AssertionError("a bad input reached a measurement")

    monkeypatch.setattr(protocol, "run_config", refuse)
    monkeypatch.setattr(serving_run, "run_serving", refuse)
    monkeypatch.setattr("benchcal.commands.host_calibration.run_default", refuse)


@pytest.mark.parametrize("name,argv,files", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(name, argv, files, tmp_path, guarded, capsys):
    runs = tmp_path / "runs"
    (runs / "llama.cpp").mkdir(parents=True)
    (runs / "llama.cpp" / "keep.json").write_text('{"kept": true}')
    for file, content in files.items():
        _write(tmp_path, file, content)
    shipped = Path(__file__).resolve().parents[1] / "runs"
    before, shipped_before = _files(runs), len(list(shipped.rglob("*.json")))
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{runs}", str(runs)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses before main returns
        code = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, f"exit {code}: {err[-300:]}"
    assert "Traceback" not in err and "internal error" not in err, err[-300:]
    assert len(lines) >= 1 and lines[-1].startswith(("benchcal: error:", "benchcal bench: error:", "usage:",
                                                      "benchcal ")), err[-300:]
    assert sum(line.startswith("benchcal") and "error" in line for line in lines) == 1, err[-300:]
    assert _files(runs) == before
    assert len(list(shipped.rglob("*.json"))) == shipped_before
