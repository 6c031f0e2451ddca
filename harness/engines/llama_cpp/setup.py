"""llama.cpp's parent side: GPU layers in step with the offload fraction, the GGUF's own quant, CPU threads, and
synthetic GGUF files laid out as llama-quantize lays out its tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from harness.engines.setup import EngineSetup, ServerSetup, catalogue_arch, default_threads, gguf_path
from predictor.errors import BenchcalError
from predictor.quants import quantized_kv


class LlamaCppSetup(EngineSetup):
    name = "llama.cpp"
    default_quant = "Q4_K_M"
    replans_offload = True
    option_keys = frozenset({"n_gpu_layers", "n_batch", "n_ubatch", "use_mmap", "threads_batch", "hub_file"})

    def fill_defaults(self, cfg: dict[str, Any]) -> None:
        """llama.cpp options: GPU layers in step with ``offload_fraction``, the GGUF's own quant, threads."""
        options = cfg["engine_options"]
        gguf = gguf_path(cfg)
        if gguf is not None and not cfg.get("quant") and gguf.is_file():
            from predictor.models import resolve_model

            cfg["quant"] = resolve_model(str(gguf)).weights_quant
        if cfg["device"] == "cpu":
            options.setdefault("n_gpu_layers", 0)
        else:
            fraction = float(cfg.get("offload_fraction") or 0.0)
            explicit = options.get("n_gpu_layers")
            if explicit is None and fraction > 0:
                options["n_gpu_layers"] = int(round((1.0 - fraction) * self.arch(cfg).num_layers))
            elif explicit is None:
                options["n_gpu_layers"] = -1
            elif int(explicit) >= 0 and fraction == 0:
                layers = self.arch(cfg).num_layers
                cfg["offload_fraction"] = round(1.0 - min(int(explicit), layers) / layers, 4)
        from harness import synthetic
        from harness.engines.llama_cpp.engine import KV_TYPES

        if cfg.get("quant") and str(cfg.get("weights") or "synthetic") == "synthetic":
            synthetic.normalize_file_type(str(cfg["quant"]))  # a format llama-quantize can write
        kv = str(cfg.get("kv_dtype") or "f16").lower()
        if kv not in KV_TYPES:
            raise BenchcalError(f"KV cache dtype {cfg.get('kv_dtype')!r} is not one llama.cpp has "
                                f"(choose from: {', '.join(KV_TYPES)})")
        options.setdefault("flash_attn", False)
        if quantized_kv(kv) and not options["flash_attn"]:
            raise BenchcalError(f"KV cache dtype {kv} without flash attention: llama.cpp refuses a quantized V cache "
                                "unless flash attention is on (add --flash-attn, or engine option flash_attn = true)")
        options.setdefault("n_batch", 512)
        options.setdefault("n_ubatch", 512)
        if cfg["device"] == "cpu":
            options.setdefault("threads", default_threads())

    def arch(self, cfg: Mapping[str, Any]) -> Any:
        """As for any engine, except that a synthetic GGUF's tensor types follow llama-quantize (output or tied
        embeddings in Q6_K, ...): it is predicted with its exact size, as any GGUF file is, not with the
        catalogue's whole-file average width."""
        from harness import synthetic

        arch = catalogue_arch(cfg)
        quant = cfg.get("quant")
        if cfg.get("weights") == "synthetic" and quant in synthetic.FILE_TYPES:
            spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
            arch = dataclasses.replace(arch, weights_bytes_exact=synthetic.weights_bytes(spec, quant),
                                       weights_quant=quant)
        return arch

    def synthetic_weights(self, cfg: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """A cached synthetic GGUF file of the catalogue model in the config's quant (Q4_K_M when none)."""
        from harness import synthetic

        spec = synthetic.resolve_spec(cfg["model"], cfg.get("arch_overrides"))
        quant = synthetic.normalize_file_type(cfg.get("quant") or "Q4_K_M")
        path = synthetic.synthetic_gguf(cfg["model"], quant, cfg.get("arch_overrides"))
        return str(path), {"weights_kind": "synthetic", "weights_file": str(path),
                           "weights_bytes": synthetic.weights_bytes(spec, quant),
                           "synthetic_layout": spec["gguf_arch"], "synthetic_exact_layout": spec["exact_layout"]}

    def hub_download(self, cfg: Mapping[str, Any], hub: Any, repo: str) -> str:
        """One GGUF file of a repository: engine options ``hub_repo`` and ``hub_file``."""
        filename = cfg.get("engine_options", {}).get("hub_file")
        if not filename:
            raise BenchcalError("--weights hub with llama.cpp needs engine option hub_repo and hub_file "
                                "(a GGUF repository and file name)")
        return hub.hf_hub_download(repo, filename)

    def server_name(self, asked: str | None, local: bool = True) -> str:
        """llama.cpp's own ``llama-server`` where one exists (``$BENCHCAL_LLAMA_SERVER``, else on PATH), else
        llama-cpp-python's ``llama_cpp.server``; ``llama-server`` asked for and none found here is refused (unless
        it is not ``local``: one already running elsewhere)."""
        from harness.engines.llama_cpp.server import LLAMA_SERVER_ENV, find_llama_server

        if asked is None:
            return "llama-server" if find_llama_server() else "llama-cpp-python"
        name = super().server_name(asked, local)
        if name == "llama-server" and local and not find_llama_server():
            raise BenchcalError(f"serve.server llama-server: no llama-server binary on PATH and {LLAMA_SERVER_ENV} "
                                "is not set")
        return name

    def server(self, cfg: Mapping[str, Any] | None = None) -> ServerSetup:
        """Its OpenAI-compatible server (:mod:`harness.engines.llama_cpp.server`): ``llama-server`` when
        ``cfg["serve"]["server"]`` names it, else llama-cpp-python's."""
        from harness.engines.llama_cpp.server import SERVER, LlamaServerBinary, find_llama_server

        if ((cfg or {}).get("serve") or {}).get("server") == "llama-server":
            binary = find_llama_server()
            if binary is None:
                raise BenchcalError("serve.server llama-server: no llama-server binary found")
            return LlamaServerBinary(binary)
        return SERVER


SETUP = LlamaCppSetup()
