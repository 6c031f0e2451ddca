"""`benchcal models --gpu G`: every catalogue model on one device, as `predict` predicts each of them."""

from __future__ import annotations

import json

import pytest

from benchcal.cli import main
from predictor.estimate import VERDICTS, predict
from predictor.models import load_catalogue


def _rows(capsys, *args: str) -> list[dict]:
    assert main(["models", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_catalogue_model_is_predicted_on_the_device_fits_first_and_largest_first(capsys):
    rows = _rows(capsys, "--gpu", "rtx-4090", "--ctx", "8192")
    assert sorted(r["id"] for r in rows) == sorted(m.id for m in load_catalogue())
    ranks = [VERDICTS.index(r["status"]) for r in rows]
    assert ranks == sorted(ranks)
    for status in {r["status"] for r in rows}:
        params = [r["params_b"] for r in rows if r["status"] == status]
        assert params == sorted(params, reverse=True)
    assert {"fits", "needs offload", "does not fit"} <= {r["status"] for r in rows}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-72b", "tinyllama-1.1b"])
def test_each_row_is_what_predict_gives_that_model(model, capsys):
    # the same prediction as `benchcal predict`: the offloaded configuration's speed where it needs offload, the
    # context capped at the model's own maximum (TinyLlama: 2,048)
    row = next(r for r in _rows(capsys, "--gpu", "rtx-4090", "--ctx", "8192") if r["id"] == model)
    arch = next(m for m in load_catalogue() if m.id == model)
    ctx = min(8192, arch.max_context)
    d = predict(arch, "rtx-4090", "Q4_K_M", ctx, "llama.cpp", prompt_tokens=min(4096, ctx), launch=False).to_dict()
    assert row["context"] == ctx and row["quant"] == "Q4_K_M"
    assert row["status"] == d["fit"]["verdict"] and row["total_gib"] == d["memory"]["total_gib"]
    assert row["decode_tok_s"] == d["throughput"]["decode_tok_s"]
    assert row["offload_fraction"] == (d["throughput"]["offload_fraction"] if row["status"] == "needs offload" else 0)


def test_a_model_that_does_not_fit_shows_no_speed(capsys):
    rows = _rows(capsys, "--gpu", "rtx-4090")
    big = next(r for r in rows if r["id"] == "deepseek-v3")
    assert big["status"] == "does not fit" and big["decode_tok_s"] is None and big["ttft_s"] is None


def test_the_table_names_the_device_and_marks_offload_speeds(capsys):
    assert main(["models", "--gpu", "l4", "--ctx", "4096"]) == 0
    out = capsys.readouterr().out
    assert "Models on NVIDIA L4 24GB" in out and "(offload)" in out and "does not fit" in out


@pytest.mark.parametrize(("args", "fragment"), [
    (["--quant", "Q4_K_M"], "give --gpu too"),
    (["--ctx", "4096"], "give --gpu too"),
    (["--gpu", "rtx-4090", "--quant", "Q9_Z"], "unknown quant"),
    (["--gpu", "no-such-gpu"], "unknown GPU"),
    (["--gpu", "rtx-4090", "--ctx", "0"], "--ctx"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment, capsys):
    try:
        code = main(["models", *args])
    except SystemExit as exc:  # argparse's refusal of a malformed number
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_without_a_device_the_catalogue_listing_is_unchanged(capsys):
    rows = _rows(capsys)
    assert len(rows) == len(load_catalogue()) and "status" not in rows[0]
