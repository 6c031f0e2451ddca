"""Run an engine in a child process the harness owns, and the child's measurement loop.

Parent side (:func:`run_engine`): the child gets its own session and process group; its stdout and stderr
stream into a log file; it reports over a dedicated pipe as JSON lines; memory is sampled from outside
(psutil RSS of the process tree, NVML on GPUs); a deadline is enforced. The whole process group is killed on
every way out: normal end, error, timeout, Ctrl-C (SIGINT) and SIGTERM to the harness. The child also asks
the kernel to kill it if the harness dies (``PR_SET_PDEATHSIG``) so no orphan keeps holding memory.

Child side (``python -m harness.engines.runner --child --events-fd N``): reads the job (JSON) from stdin,
loads the engine, runs warm-ups then repetitions for every prompt length and for decode, sending one
event per measurement. Events: ``started``, ``version``, ``loaded``, ``phase``, ``prefill``, ``decode``,
``done``, ``error``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.engines.base import Engine, classify_failure, engine_class
from harness.samplers import NvmlSampler, RssTreeSampler, nvml_available

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 200
KILL_GRACE_S = 3.0
DEFAULT_DECODE_PROMPT_TOKENS = 16
PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM received by the harness; handled like Ctrl-C."""


@dataclass
class EngineRun:
    """What happened to one child: status, events it sent, memory seen from outside, log tail."""

    status: str
    reason: str | None
    returncode: int | None
    events: list[dict[str, Any]]
    log_path: Path
    log_tail: list[str]
    memory: dict[str, Any]
    version: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    child_pid: int | None = None

    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    def find(self, event: str) -> list[dict[str, Any]]:
        """Events of one kind, in arrival order."""
        return [e for e in self.events if e.get("event") == event]


# ------------------------------------------------------------------------------------------ parent side


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["BENCHCAL_PARENT_PID"] = str(os.getpid())
    return env


def kill_process_tree(proc: subprocess.Popen[Any], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the child's process group, then SIGKILL it and any descendant that escaped the group."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                continue
    for child in descendants:
        try:
            child.kill()
        except psutil.Error:
            pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    psutil.wait_procs(descendants, timeout=grace_s)


class _EventReader:
    """Non-blocking reader of JSON lines from a pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.closed = False

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        if self.closed:
            time.sleep(timeout_s)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.closed = True
        self._buffer += chunk
        events = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if line.strip():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    events.append({"event": "garbled", "text": line[:200].decode(errors="replace")})
        return events


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, list[str]]:
    """The whole log text and its last ``lines`` lines."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", []
    return text, text.splitlines()[-lines:]


def run_engine(
    config: Mapping[str, Any],
    weights_path: str | None,
    log_path: str | os.PathLike[str],
    timeout_s: float = 900.0,
    device_index: int | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    seed: int | None = None,
) -> EngineRun:
    """Run one config's measurements in a child process and return what happened (never raises for the
    engine's failures; re-raising Ctrl-C is the caller's job once the record is written).

    ``device_index``: the NVML index of the GPU to watch (None: no NVML sampling, CPU runs).
    """
    cls = engine_class(str(config["engine"]))
    log_file = Path(log_path)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    read_fd, write_fd = os.pipe()
    job = {"config": dict(config), "weights_path": weights_path, "seed": seed if seed is not None else time.time_ns()}
    watched: dict[str, Any] = {"proc": None, "rss": None}

    def engine_pids() -> set[int]:
        pids = watched["rss"].tree_pids() if watched["rss"] is not None else set()
        return pids | ({watched["proc"].pid} if watched["proc"] is not None else set())

    nvml = NvmlSampler(engine_pids, device_index) if device_index is not None and nvml_available() else None
    events: list[dict[str, Any]] = []
    timed_out = interrupted = False
    started = time.perf_counter()
    previous_term = install_sigterm()
    # Ctrl-C sets a flag the loop reads every 50 ms rather than raising KeyboardInterrupt wherever the main
    # thread happens to be: inside a progress callback it could leave a lock held that the progress bar's
    # refresh thread waits on when it stops, and the harness would hang instead of exiting.
    sigint: list[int] = []
    previous_int = _flag_sigint(sigint)
    proc: subprocess.Popen[Any] | None = None
    rss: RssTreeSampler | None = None
    try:
        with log_file.open("wb") as log_handle:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.engines.runner", "--child", "--events-fd", str(write_fd)],
                stdin=subprocess.PIPE, stdout=log_handle, stderr=subprocess.STDOUT,
                pass_fds=(write_fd,), start_new_session=True, env=_child_env(), cwd=os.getcwd(),
            )
        os.close(write_fd)
        write_fd = -1
        rss = RssTreeSampler(proc.pid)
        watched.update(proc=proc, rss=rss)
        rss.start()
        if nvml is not None:
            nvml.start()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
        reader = _EventReader(read_fd)
        deadline = started + timeout_s
        while True:
            if sigint:
                interrupted = True
                break
            for event in reader.poll(0.05):
                events.append(event)
                if event.get("event") == "started":
                    rss.mark_baseline()
                if on_event is not None:
                    on_event(event)
            if proc.poll() is not None and reader.closed:
                break
            if proc.poll() is not None:
                for event in reader.poll(0.2):
                    events.append(event)
                break
            if time.perf_counter() > deadline:
                timed_out = True
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        interrupted = interrupted or bool(sigint)
        _ignore_sigint()
        try:
            if proc is not None:
                kill_process_tree(proc)
            rss_report = rss.stop() if rss is not None else {}
            nvml_report = nvml.stop() if nvml is not None else None
        finally:
            if write_fd >= 0:
                os.close(write_fd)
            os.close(read_fd)
            if previous_int is not None:
                signal.signal(signal.SIGINT, previous_int)
            restore_sigterm(previous_term)
    wall_s = time.perf_counter() - started
    log_text, tail = read_log_tail(log_file)
    error = next((e for e in events if e.get("event") == "error"), None)
    returncode = proc.returncode if proc is not None else None
    done = any(e.get("event") == "done" for e in events)
    status, reason = classify_failure(
        returncode if not done else 0, log_text, cls.oom_patterns, timed_out=timed_out, interrupted=interrupted,
        child_error=(f"{error.get('type')}: {error.get('message')}" if error else None),
    )
    memory = memory_report(rss_report, nvml_report)
    memory["engine_breakdown"] = _breakdown(cls, log_text)
    version = next((e.get("version", {}) for e in events if e.get("event") == "version"), {})
    return EngineRun(status, reason, returncode, events, log_file, tail, memory, version, wall_s,
                     proc.pid if proc is not None else None)


def _breakdown(cls: type[Engine], log_text: str) -> dict[str, Any]:
    try:
        return cls.memory_breakdown(log_text)
    except Exception as exc:  # a parser bug must not lose the run
        return {"error": f"{type(exc).__name__}: {exc}"}


def memory_report(rss: Mapping[str, Any], nvml: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record's ``memory`` section: NVML figures when a GPU was watched, else RSS of the tree (the engine's
    child here, a server's process tree in :mod:`harness.serving.server`)."""
    primary = nvml if nvml is not None else rss
    return {
        "peak_bytes": primary.get("peak_bytes"),
        "peak_source": primary.get("peak_source") or None,
        "baseline_bytes": primary.get("baseline_bytes"),
        "peak_time_s": primary.get("peak_time_s"),
        "sample_count": primary.get("sample_count", 0),
        "sample_hz": primary.get("sample_hz"),
        "foreign_processes": list((nvml or {}).get("foreign_processes") or []),
        "device_peak_bytes": (nvml or {}).get("device_peak_bytes"),
        "host_peak_rss_bytes": rss.get("peak_bytes"),
        "host_baseline_rss_bytes": rss.get("baseline_bytes"),
        "host_sample_hz": rss.get("sample_hz"),
    }


def install_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` (a KeyboardInterrupt) in the main thread; returns the previous handler
    (None off the main thread), for :func:`restore_sigterm`."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)


def restore_sigterm(previous: Any) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


def _flag_sigint(flags: list[int]) -> Any:
    """Make SIGINT append to ``flags``; returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, lambda signum, frame: flags.append(signum))


def _ignore_sigint() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


# ------------------------------------------------------------------------------------------- child side


def kill_with_parent() -> None:
    """In a child between fork and exec (``Popen(preexec_fn=...)``): ask Linux to SIGKILL it when the harness dies,
    even by SIGKILL, which no handler sees."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the harness exits; exit now if it already has."""
    parent = int(os.environ.get("BENCHCAL_PARENT_PID", "0") or 0)
    kill_with_parent()
    if parent and os.getppid() != parent:
        os._exit(3)


def _rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


def measure(engine: Engine, config: Mapping[str, Any], emit: Callable[[dict[str, Any]], None],
            rng: random.Random) -> None:
    """Warm-ups then repetitions: prefill for every prompt length, then decode; one event per measurement."""
    prompts = [int(p) for p in config.get("prompt_tokens") or []]
    reps, warmup = int(config.get("reps") or 5), int(config.get("warmup") or 0)
    for n_prompt in prompts:
        emit({"event": "phase", "phase": "prefill", "prompt_tokens": n_prompt, "runs": warmup + reps})
        for i in range(warmup + reps):
            timing = engine.measure_prompt(engine.random_prompt(n_prompt, rng))
            emit({"event": "prefill", "rep": i - warmup, "warmup": i < warmup, "timing": timing.to_dict()})
    n_gen = int(config.get("gen_tokens") or 0)
    if n_gen >= 2:
        context = min(prompts) if prompts else DEFAULT_DECODE_PROMPT_TOKENS
        emit({"event": "phase", "phase": "decode", "prompt_tokens": context, "runs": warmup + reps})
        for i in range(warmup + reps):
            timing = engine.measure_decode(engine.random_prompt(context, rng), n_gen)
            emit({"event": "decode", "rep": i - warmup, "warmup": i < warmup, "timing": timing.to_dict()})


def child_main(argv: list[str] | None = None) -> int:
    """Entry point of the child process."""
    parser = argparse.ArgumentParser(prog="harness.engines.runner")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--events-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    stream = os.fdopen(args.events_fd, "w", buffering=1, encoding="utf-8")

    def emit(event: dict[str, Any]) -> None:
        event.setdefault("t_s", time.perf_counter())
        stream.write(json.dumps(event, default=str) + "\n")
        stream.flush()

    engine: Engine | None = None
    try:
        job = json.loads(sys.stdin.read())
        config = job["config"]
        cls = engine_class(config["engine"])
        emit({"event": "started", "pid": os.getpid(), "rss_bytes": _rss_bytes()})
        engine = cls()
        info = engine.load(config, job.get("weights_path"))
        emit({"event": "version", "version": cls.version()})
        emit({"event": "loaded", "load": info.to_dict(), "rss_bytes": _rss_bytes()})
        measure(engine, config, emit, random.Random(job.get("seed")))
        emit({"event": "done", "rss_bytes": _rss_bytes()})
        return 0
    except BaseException as exc:  # report everything, including MemoryError and KeyboardInterrupt
        emit({"event": "error", "type": type(exc).__name__, "message": str(exc).strip()[:2000],
              "traceback": traceback.format_exc()[-4000:]})
        return 1
    finally:
        if engine is not None:
            try:
                engine.close()
            except Exception:
                pass
        sys.stderr.flush()
        stream.close()


if __name__ == "__main__":
    sys.exit(child_main())
