"""Leave-one-source-out cross-validation: a run's source group, and every source held out as a whole.

The records are the synthetic fixtures of ``test_calibration_fit`` (values computed by the predictor's
formulas, written only to pytest's temporary directories), relabelled with made-up publishers so that
the sources cut across devices and models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_calibration_fit import FIXTURE_CONTEXTS, FIXTURE_QUANTS, fixture_record, true_table

import calibration.crossval as crossval
from calibration.dataset import QUANTITIES, load_dataset
from calibration.observations import imported_source_set, source_set, url_source
from calibration.output import to_markdown
from harness import records

DEVICES = ("rtx-4090", "a100-sxm-80gb")
MODELS = ("qwen2.5-0.5b", "llama-3.1-8b", "qwen2.5-14b")
# (device, model) -> made-up publisher of an imported set; pairs not listed stay measured runs. Each
# publisher spans both devices and two models, so LOSO folds are neither LODO nor LOMO folds.
PUBLISHERS = {
    ("rtx-4090", "qwen2.5-0.5b"): "alice", ("a100-sxm-80gb", "llama-3.1-8b"): "alice",
    ("rtx-4090", "llama-3.1-8b"): "bob", ("a100-sxm-80gb", "qwen2.5-14b"): "bob",
}


def _imported(publisher: str) -> dict:
    url = f"https://github.com/{publisher}/llm-benchmarks/blob/0123456789abcdef0123456789abcdef01234567/results.md"
    return {"source": "imported", "imported_from": f"{publisher}-results.md", "source_url": url,
            "import_format": "llama-bench md", "synthetic_fixture": True, "engine_version": "fixture"}


@pytest.fixture(scope="module")
def sourced_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sourced_fixture")
    table = true_table()
    for device in DEVICES:
        for model in MODELS:
            for quant in FIXTURE_QUANTS:
                for context in FIXTURE_CONTEXTS:
                    record = fixture_record(model, device, quant, context, table)
                    publisher = PUBLISHERS.get((device, model))
                    if publisher:
                        record["provenance"] = _imported(publisher)
                    records.write_record(record, root)
    return root


def test_url_source_names_the_repository_or_the_thread():
    assert url_source("https://github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference/blob/aa72e0e/LLaMA%203/x.ipynb") \
        == "XiongjieDai/GPU-Benchmarks-on-LLM-Inference"
    assert url_source("https://github.com/geerlingguy/ai-benchmarks/issues/48") == "geerlingguy/ai-benchmarks#48"
    assert url_source("https://example.org/posts/bench?x=1") == "example.org/posts/bench"
    assert url_source(None) is None


def test_source_set_of_imported_and_measured_records():
    # A shipped excerpt: its folder under tests/data/imported, found from the file name and URL.
    url = ("https://github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference/blob/aa72e0ec86c356c41f8281c9733e9a13c3675800/"
           "LLaMA%203/Gaming%20GPUs/4090_v3.ipynb")
    assert imported_source_set("4090_v3-8b-q4_k_m-cell11.md", url) == "llama3-gpu-benchmarks"
    assert imported_source_set("strix-halo/anything.jsonl", None) == "strix-halo"
    # apple-silicon gathers three publishers' threads: each is its own source.
    m1 = imported_source_set("m1-ultra-tinyllama-1.1b-q4_k_m.md", "https://github.com/geerlingguy/ai-benchmarks/issues/48")
    m3 = imported_source_set("m3-ultra-llama-3.3-70b-q4_k_m.md",
                             "https://github.com/geerlingguy/beowulf-ai-cluster/issues/17")
    assert m1 == "apple-silicon:geerlingguy/ai-benchmarks#48"
    assert m3 == "apple-silicon:geerlingguy/beowulf-ai-cluster#17"
    # The same file name published elsewhere is not a shipped excerpt.
    assert imported_source_set("results.json", "https://github.com/someone/bench/blob/abc/results.json") \
        == "imported:someone/bench"
    assert imported_source_set("mine.csv", None) == "imported:mine.csv"
    cpu = {"config": {"device": "cpu"}, "provenance": {"source": "measured", "host_id": "cpu-test-host"}}
    gpu = {"config": {"device": "rtx-4090"}, "provenance": {"source": "measured"}}
    assert source_set(cpu) == "measured:cpu-test-host"
    assert source_set(gpu) == "measured:rtx-4090"


def test_source_set_reaches_every_block(sourced_dir):
    dataset = load_dataset(sourced_dir)
    expected = {"imported:alice/llm-benchmarks", "imported:bob/llm-benchmarks",
                "measured:rtx-4090", "measured:a100-sxm-80gb"}
    for q in QUANTITIES:
        meta = dataset.blocks[q].meta
        assert set(meta["source_set"]) == expected, q
        for device, model, group in zip(meta["device"], meta["model"], meta["source_set"], strict=True):
            publisher = PUBLISHERS.get((device, model))
            assert group == (f"imported:{publisher}/llm-benchmarks" if publisher else f"measured:{device}")


def test_leave_one_source_out_holds_each_source_out_whole(sourced_dir, monkeypatch):
    dataset = load_dataset(sourced_dir)
    folds = []
    real_fit = crossval.fit_table

    def spy(data, masks=None, **kwargs):
        folds.append({q: np.asarray(m).copy() for q, m in masks.items()})
        return real_fit(data, masks, **kwargs)

    monkeypatch.setattr(crossval, "fit_table", spy)
    predictions = crossval.leave_one_source_out(dataset)

    groups = {q: dataset.blocks[q].meta["source_set"].to_numpy() for q in QUANTITIES}
    held_sources = []
    for masks in folds:
        held = {q: ~masks[q] for q in QUANTITIES}
        names = set().union(*(set(groups[q][held[q]]) for q in QUANTITIES))
        assert len(names) == 1, f"a fold held out several sources: {names}"
        name = names.pop()
        for q in QUANTITIES:  # every row of that source, in every block, and nothing else
            np.testing.assert_array_equal(held[q], groups[q] == name)
        held_sources.append(name)
    assert sorted(held_sources) == sorted(set(groups["decode"]))
    # Each source's fold held devices and models that stayed in the fit through other sources.
    meta = dataset.blocks["decode"].meta
    for name in held_sources:
        rows = meta["source_set"] == name
        assert meta.loc[~rows, "device"].isin(meta.loc[rows, "device"]).any()
    for q in ("decode", "prefill", "memory"):
        assert np.isfinite(predictions[q]).all(), q


def test_cross_validate_reports_loso(sourced_dir):
    dataset = load_dataset(sourced_dir)
    table = crossval.fit_table(dataset)
    cv = crossval.cross_validate(dataset, table)
    assert set(cv["predictions"]) == {"in_sample", "lodo", "lomo", "lofo", "loso"}
    assert cv["metrics"]["loso"]["overall"]["decode"]["n"] == len(dataset.blocks["decode"])
    table = crossval.annotate(table, dataset, cv)
    assert "leave one source out, all runs" in to_markdown(table)
    assert "leave one family out, all runs" in to_markdown(table)
