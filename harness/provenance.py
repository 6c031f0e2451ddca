"""What a measured record says about where it came from: the machine, the device and the harness itself."""

from __future__ import annotations

import functools
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from harness import records
from harness.engines.runner import REPO_ROOT


@functools.lru_cache(maxsize=1)
def harness_version() -> str | None:
    """The benchcal distribution's version (installed metadata, else pyproject.toml)."""
    try:
        from importlib.metadata import version

        return version("benchcal")
    except Exception:
        pass
    try:
        text = (REPO_ROOT / "pyproject.toml").read_text()
    except OSError:
        return None
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
    return match.group(1) if match else None


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The repository's HEAD commit, with ``-dirty`` when the work tree has changes; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def base_provenance(cfg: Mapping[str, Any], host: Mapping[str, Any], gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """Provenance known before the run (machine, device, harness)."""
    import psutil

    from harness.hostbench import device_bandwidth_gbs

    prov: dict[str, Any] = {
        "source": "measured",
        "cpu_model": host.get("cpu_model"),
        "cpu_cores": host.get("cores"),
        "host_memory_bytes": int(psutil.virtual_memory().total),
        "cpu_flags": host.get("cpu_flags"),
        "host_id": host.get("host_id"),
        "host_bandwidth_gbs": host.get("bandwidth_gbs"),
        "host_copy_bandwidth_gbs": host.get("copy_bandwidth_gbs"),
        "host_matmul_gflops": host.get("matmul_gflops"),
        "host_probe": {"method": host.get("method"), "disturbed": host.get("probe_disturbed") or [],
                       "error": host.get("matmul_error")},
        "harness_version": harness_version(),
        "git_commit": git_commit(),
        "command_line": " ".join(sys.argv),
        **({"trust_remote_code": "allowed by --trust-remote-code"}
           if (cfg.get("engine_options") or {}).get("trust_remote_code") else {}),
        "hostname": socket.gethostname(),
        "started_at": records.utc_now(),
    }
    if gpu:
        prov.update({k: gpu.get(k) for k in ("device_name", "device_uuid", "driver", "cuda", "clocks_mhz",
                                             "power_limit_w", "memory_total_bytes")})
        prov["device_bandwidth_gbs"] = device_bandwidth_gbs(0, gpu.get("device_uuid"))
    else:
        prov.update({"device_name": host.get("cpu_model"), "memory_total_bytes": int(psutil.virtual_memory().total),
                     "device_bandwidth_gbs": host.get("bandwidth_gbs")})
    return prov
