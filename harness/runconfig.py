"""A run's configuration before it runs: normalized and checked, the engine's defaults filled in, its weights
prepared and its log's path. Engine-free, and below the protocol (:mod:`harness.protocol`) and the host probe
(:mod:`harness.hostbench`), which both run configurations."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import records
from harness.engines import engine_setup
from predictor.errors import BenchcalError

# ------------------------------------------------------------------------------------------------ config

# Running a model repository's own Python code (vLLM's trust_remote_code) is allowed only when the command line
# says so (``benchcal bench --trust-remote-code`` calls :func:`permit_remote_code`): a sweep file or a record
# cannot turn it on by itself.
_REMOTE_CODE_PERMITTED = False


def permit_remote_code(allowed: bool = True) -> None:
    """Allow (or forbid again) configurations whose engine options ask to run a model's own code."""
    global _REMOTE_CODE_PERMITTED
    _REMOTE_CODE_PERMITTED = bool(allowed)


def remote_code_permitted() -> bool:
    return _REMOTE_CODE_PERMITTED



def check_types(config: Mapping[str, Any]) -> None:
    """The types, ranges and keys of a configuration's fields, before anything reads them
    (:data:`harness.config_schema.CONFIG_SCHEMA`, checked with jsonschema); BenchcalError naming the field and the
    value."""
    if not isinstance(config, Mapping):
        raise BenchcalError(f"a run configuration must be a table, got {config!r}")
    from harness.config_schema import check_config

    check_config(dict(config))


def prepare_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize ``config`` and check what a user can get wrong; BenchcalError with one line otherwise."""
    check_types(config)
    cfg = records.normalize_config(config)
    if not cfg.get("model"):
        raise BenchcalError("a run needs a model")
    if cfg["engine"] not in records.ENGINES:
        raise BenchcalError(f"unknown engine {cfg['engine']!r} (choose from: {', '.join(records.ENGINES)})")
    if cfg.get("serve") is not None:  # a serving run: the server holds up to max_num_seqs sequences at once
        from harness.serving.config import normalize_serve

        cfg["serve"] = normalize_serve(cfg["serve"])
        cfg["batch"] = cfg["serve"]["max_num_seqs"]
        # the server that runs it (refused for an engine without one, before anything runs); an external server's
        # is the one it says it is (harness.serving.external.probe), nothing of it to find here
        cfg["serve"]["server"] = engine_setup(cfg["engine"]).server_name(
            cfg["serve"].get("server"), local=cfg["serve"].get("external") is None)
        if int(cfg["gen_tokens"]) < 1:
            raise BenchcalError("a serving run generates at least one token per request (gen_tokens >= 1)")
    for key in ("context", "reps", "batch", "device_count"):
        if int(cfg[key]) <= 0:
            raise BenchcalError(f"{key} must be positive, got {cfg[key]!r}")
    if int(cfg["warmup"]) < 0 or int(cfg["gen_tokens"]) < 0:
        raise BenchcalError("warmup and gen_tokens must be zero or positive")
    longest = max(cfg["prompt_tokens"] or [0])
    if min(cfg["prompt_tokens"] or [1]) <= 0:
        raise BenchcalError("prompt lengths must be positive")
    if longest + 1 > cfg["context"]:
        raise BenchcalError(f"a {longest}-token prompt does not fit a context of {cfg['context']} tokens")
    decode_context = min(cfg["prompt_tokens"] or [16])
    if decode_context + cfg["gen_tokens"] > cfg["context"]:
        raise BenchcalError(f"{decode_context} prompt + {cfg['gen_tokens']} generated tokens exceed the "
                            f"context of {cfg['context']}")
    if cfg["engine_options"].get("trust_remote_code") and not _REMOTE_CODE_PERMITTED:
        raise BenchcalError("engine option trust_remote_code runs the model repository's own Python code: pass "
                            "--trust-remote-code on the command line to allow it")
    setup = engine_setup(cfg["engine"])
    check_option_keys(cfg, setup)
    setup.fill_defaults(cfg)
    check_model(cfg, setup)
    return cfg


def check_option_keys(cfg: Mapping[str, Any], setup: Any) -> None:
    """Refuse an engine option the engine does not read (a typo would otherwise be measured as the default)."""
    from harness.engines.setup import COMMON_OPTIONS
    from predictor.errors import suggest

    known = COMMON_OPTIONS | setup.option_keys
    for key in sorted(cfg["engine_options"]):
        if key not in known:
            raise BenchcalError(f"unknown engine option {key!r} for {cfg['engine']}{suggest(key, known)}; "
                                f"{cfg['engine']} reads {', '.join(sorted(known))}")


def check_model(cfg: Mapping[str, Any], setup: Any) -> None:
    """What the configuration measures exists and fits the model: its weights file, the model (catalogue id or
    file) with its overrides, and a context within the model's maximum (the engine's own options, formats and KV
    types are its setup's to check, in ``fill_defaults``)."""
    weights = str(cfg.get("weights") or "synthetic")
    if weights == "external" and not (cfg.get("serve") or {}).get("external"):
        raise BenchcalError("weights 'external' names a server that is already running: give serve.external")
    if weights not in ("synthetic", "hub", "external") and not Path(weights).expanduser().exists():
        raise BenchcalError(f"weights file {weights} does not exist")
    if weights not in ("synthetic", "hub", "external") and Path(weights).expanduser().is_dir():
        return  # a model directory: the engine reads its config itself, the catalogue need not know it
    arch = setup.arch(cfg)
    if int(cfg["context"]) > int(arch.max_context):
        rs = arch.rope_scaling
        scaled = (f"; bench measures up to the config's maximum, without the {rs.describe()} its card documents, "
                  "which benchcal predict covers") if rs is not None and not rs.in_config else ""
        raise BenchcalError(f"context {cfg['context']} is above {arch.id}'s maximum of {arch.max_context} tokens{scaled}")



def model_arch(cfg: Mapping[str, Any]) -> Any:
    """The architecture a config measures, as its engine lays out the weights (:meth:`EngineSetup.arch`)."""
    return engine_setup(cfg["engine"]).arch(cfg)


# ----------------------------------------------------------------------------------------------- weights


def prepare_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Path of the weights to load and facts about them (for provenance)."""
    weights = str(cfg.get("weights") or "synthetic")
    if weights == "synthetic":
        return engine_setup(cfg["engine"]).synthetic_weights(cfg)
    if weights == "hub":
        return _hub_weights(cfg)
    path = Path(weights).expanduser()
    if not path.exists():
        raise BenchcalError(f"weights file {weights} does not exist")
    return str(path), {"weights_kind": "path", "weights_file": str(path), "weights_bytes": _size(path)}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _hub_weights(cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Download the model's weights from the Hugging Face hub, as the engine loads them."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise BenchcalError("--weights hub needs huggingface_hub (pip install huggingface_hub)") from exc
    from predictor.models import resolve_model

    arch = resolve_model(cfg["model"])
    repo = cfg.get("engine_options", {}).get("hub_repo") or arch.hf_id
    if not repo:
        raise BenchcalError(f"{cfg['model']} has no Hugging Face id; pass --weights PATH")
    try:
        path = engine_setup(cfg["engine"]).hub_download(cfg, huggingface_hub, repo)
    except BenchcalError:
        raise
    except Exception as exc:
        raise BenchcalError(f"could not download {repo} from the hub ({type(exc).__name__}); "
                            "no network? pass --weights PATH") from exc
    return path, {"weights_kind": "hub", "weights_file": path, "hub_repo": repo}


# ------------------------------------------------------------------------------------------------- log

def log_path_for(cfg: Mapping[str, Any]) -> Path:
    """Where the child's log goes: ``$BENCHCAL_CACHE/logs/<time>-<hash10>.log``."""
    from harness.synthetic import cache_dir

    stamp = records.new_record_id(records.config_hash(cfg))
    return cache_dir() / "logs" / f"{stamp}.log"
