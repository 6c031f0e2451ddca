"""An engine's OpenAI-compatible server as a child process: started in its own process group on 127.0.0.1 with a
free port, waited for until it answers, its memory sampled (RSS of its process tree; NVML on a GPU), its
Prometheus metrics read where it has them, and always stopped, on every exit path (a ``with`` block; SIGTERM to the
harness is handled like Ctrl-C by :func:`harness.serving.run.run_serving`, and the kernel kills the server if the
harness dies without a chance to stop it).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.engines.runner import kill_process_tree, kill_with_parent, memory_report, read_log_tail
from harness.samplers import NvmlSampler, RssTreeSampler, nvml_available

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOCALHOST, 0))
        return int(probe.getsockname()[1])


class ServerFailed(RuntimeError):
    """The server exited, or did not answer before its start-up timeout."""


class ServerProcess:
    """``with ServerProcess(command, log_path, ...) as server:`` starts the server and waits until
    ``ready_path`` answers 200; leaving the block (normally, by an exception or Ctrl-C) kills its process tree."""

    def __init__(self, command: Sequence[str], log_path: str | os.PathLike[str], *, port: int,
                 ready_path: str = "/v1/models", env: Mapping[str, str] | None = None,
                 startup_timeout_s: float = 600.0, device_index: int | None = None) -> None:
        self.command = list(command)
        self.log_path = Path(log_path)
        self.port = port
        self.ready_path = ready_path
        self.env = dict(env) if env is not None else dict(os.environ)
        self.startup_timeout_s = startup_timeout_s
        self.device_index = device_index
        self.proc: subprocess.Popen[Any] | None = None
        self.rss: RssTreeSampler | None = None
        self.nvml: NvmlSampler | None = None
        self.startup_s: float | None = None
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=self.env, preexec_fn=kill_with_parent)
        try:
            self.rss = RssTreeSampler(self.proc.pid).start()
            if self.device_index is not None and nvml_available():
                self.nvml = NvmlSampler(self.pids, self.device_index).start()
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def pids(self) -> set[int]:
        tree = self.rss.tree_pids() if self.rss is not None else set()
        return tree | ({self.proc.pid} if self.proc is not None else set())

    def _wait_ready(self, started: float) -> None:
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise ServerFailed(f"the server exited with status {self.proc.returncode} before it answered")
            if time.perf_counter() - started > self.startup_timeout_s:
                raise ServerFailed(f"the server did not answer {self.ready_path} within {self.startup_timeout_s:.0f} s")
            try:
                with urllib.request.urlopen(self.base_url + self.ready_path, timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)

    def memory(self) -> dict[str, Any]:
        """Peak memory so far, as a run record's ``memory`` section (:func:`harness.engines.runner.memory_report`)."""
        rss = self.rss.report() if self.rss is not None else {}
        return memory_report(rss, self.nvml.report() if self.nvml is not None else None)

    def stop(self) -> None:
        """Kill the server's process tree (with any descendant that outlived it) and stop the samplers; idempotent."""
        if self.proc is not None:
            kill_process_tree(self.proc)
        if not self._stopped:
            self._stopped = True
            for sampler in (self.rss, self.nvml):
                if sampler is not None:
                    sampler.stop()

    def log_tail(self) -> tuple[str, list[str]]:
        return read_log_tail(self.log_path)


# ------------------------------------------------------------------------------------------------ metrics

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eEinfNa]+)")
# vLLM's Prometheus metrics that describe the load (vllm/v1/metrics/loggers.py): gauges and counters.
VLLM_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
                "vllm:generation_tokens_total")
# llama-server's (with --metrics): requests decoding and waiting for a slot, and its token counters
LLAMA_SERVER_METRICS = ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
                        "llamacpp:tokens_predicted_total")
SERVER_METRICS = VLLM_METRICS + LLAMA_SERVER_METRICS


def parse_metrics(text: str, names: Sequence[str] = SERVER_METRICS) -> dict[str, float]:
    """The sum over label sets of each named metric in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match and match.group("name") in names:
            try:
                out[match.group("name")] = out.get(match.group("name"), 0.0) + float(match.group("value"))
            except ValueError:
                continue
    return out


def read_metrics(base_url: str, path: str = "/metrics", headers: Mapping[str, str] | None = None,
                 ) -> dict[str, float] | None:
    """The server's metrics now, or None when it has no such endpoint. ``headers``: sent with the request."""
    try:
        request = urllib.request.Request(base_url + path, headers=dict(headers or {}))
        with urllib.request.urlopen(request, timeout=2.0) as response:
            return parse_metrics(response.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None
