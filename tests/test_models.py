"""The model catalogue: published totals, sources, ids, and model-name resolution."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from predictor.errors import BenchcalError
from predictor.models import (
    load_catalogue,
    load_catalogue_entries,
    model_ids,
    normalize_model_name,
    resolve_model,
)

REQUIRED_IDS = [
    "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b",
    "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "qwen3-30b-a3b",
    "qwen3-235b-a22b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
    "llama-3.3-70b", "llama-3.2-1b", "llama-3.2-3b", "mistral-small-24b", "mixtral-8x7b", "gemma-3-4b",
    "gemma-3-12b", "gemma-3-27b", "phi-4", "deepseek-v3", "deepseek-r1", "gpt-oss-20b", "gpt-oss-120b",
    "qwq-32b", "deepseek-r1-distill-qwen-32b", "deepseek-r1-distill-llama-70b", "smollm2-135m", "smollm2-360m",
]
ENTRIES = {e["id"]: e for e in load_catalogue_entries()}
ARCHS = {a.id: a for a in load_catalogue()}


def test_catalogue_holds_every_required_model():
    assert len(ARCHS) >= 30
    assert sorted(set(REQUIRED_IDS) - set(ARCHS)) == []
    assert model_ids() == sorted(model_ids())


@pytest.mark.parametrize("model_id", sorted(ENTRIES))
def test_counted_params_match_published_total_within_half_a_percent(model_id):
    entry, arch = ENTRIES[model_id], ARCHS[model_id]
    published = entry["published_params_b"] * 1e9
    # A card that prints "0.6B" only says the total lies within half a unit of its last digit.
    tolerance = max(0.005 * published, (entry.get("published_params_rounding_b") or 0) * 1e9 / 2)
    assert abs(arch.params_total - published) <= tolerance, (arch.params_total, published)


@pytest.mark.parametrize("model_id", sorted(i for i, e in ENTRIES.items() if e.get("published_active_params_b")))
def test_counted_active_params_match_published_active_within_two_percent(model_id):
    # Published active figures carry two or three significant digits (3.3B, 22B, 37B).
    entry, arch = ENTRIES[model_id], ARCHS[model_id]
    counted = {"bytes_read": arch.params_active,
               "with_embedding": arch.params_active_published_style}[entry["published_active_convention"]]
    assert counted == pytest.approx(entry["published_active_params_b"] * 1e9, rel=0.02)


@pytest.mark.parametrize("model_id", sorted(ENTRIES))
def test_every_entry_names_its_config_and_published_sources(model_id):
    entry = ENTRIES[model_id]
    assert entry["source"] == f"https://huggingface.co/{entry['hf_id']}/blob/main/config.json"
    assert entry["published_params_source"].startswith("https://")
    assert entry.get("published_params_note")
    if entry.get("extra_params"):
        assert entry["extra_params_source"].startswith("https://")
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"):
        assert field in entry["config"] or field in entry["config"].get("text_config", {}) or entry.get("config_note")
    assert entry["config"].get("torch_dtype")


def test_ids_are_short_lowercase_and_match_file_names():
    for model_id, entry in ENTRIES.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", model_id)
        assert Path(entry["_path"]).stem == model_id


@pytest.mark.parametrize("spec,expected", [
    ("qwen2.5-72b", "qwen2.5-72b"),
    ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
    ("Qwen2.5-72B-Instruct", "qwen2.5-72b"),
    ("qwen2.5:72b", "qwen2.5-72b"),
    ("llama-3-8b", "llama-3-8b"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("llama3.1:8b", "llama-3.1-8b"),
    ("google/gemma-3-27b-it", "gemma-3-27b"),
    ("gemma3:27b", "gemma-3-27b"),
    ("gpt-oss:20b", "gpt-oss-20b"),
    ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("qwen3:30b-a3b", "qwen3-30b-a3b"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"),
    ("QWEN3-8B", "qwen3-8b"),
])
def test_resolve_model_accepts_ids_hf_ids_and_forgiving_variants(spec, expected):
    assert resolve_model(spec).id == expected


def test_normalized_names_are_unique_across_the_catalogue():
    keys = {}
    for entry in load_catalogue_entries():
        for name in [entry["id"], entry["hf_id"], *entry["aliases"]]:
            key = normalize_model_name(name)
            assert keys.setdefault(key, entry["id"]) == entry["id"], name


def test_unknown_model_raises_with_a_suggestion():
    with pytest.raises(BenchcalError, match=r"unknown model 'qwen9-72b' \(did you mean: .*qwen2\.5-72b"):
        resolve_model("qwen9-72b")
    with pytest.raises(BenchcalError, match=r"works from its config\.json, its Hugging Face folder or a \.gguf file"):
        resolve_model("mistral-nemo")  # not in the catalogue: the message says a path works


def test_nonexistent_path_raises():
    with pytest.raises(BenchcalError, match="does not exist"):
        resolve_model("./no/such/model.gguf")


def test_catalogue_architecture_fields_come_from_the_config():
    arch = resolve_model("qwen3-30b-a3b")
    assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("qwen3_moe", 128, 8)
    assert arch.source.endswith("Qwen/Qwen3-30B-A3B/blob/main/config.json")
    assert arch.published_params_b == 30.5
    assert resolve_model("gemma-3-27b").architecture == "gemma3"
