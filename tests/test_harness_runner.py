"""Runner pieces without an engine: failure classification, throughput arithmetic, process-tree cleanup,
and the RSS sampler against a process with a known allocation."""

from __future__ import annotations

import random
import subprocess
import sys
import time

import psutil
import pytest

from harness.engines import base
from harness.engines.runner import kill_process_tree
from harness.samplers import RssTreeSampler
from predictor.errors import BenchcalError


@pytest.mark.parametrize("args, expected", [
    ((0, "all good"), "ok"),
    ((-9, ""), "crash"),
    ((1, "", (), False, False, "RuntimeError: boom"), "crash"),
    ((1, "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 512.00 MiB on device 0: cudaMalloc failed: out of memory"), "oom"),
    ((1, "", (), False, False, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
    ((None, "", (), True), "timeout"),
    ((-2, "failed to allocate buffer", (), False, True), "interrupted"),
])
def test_classify_failure(args, expected):
    assert base.classify_failure(*args)[0] == expected


def test_out_of_memory_text_in_a_successful_run_is_not_a_failure():
    log = "ggml_backend_cuda_host_malloc: failed to allocate 512.00 MiB of pinned memory: out of memory"
    assert base.classify_failure(0, log) == ("ok", None)


def test_decode_and_prefill_rates_follow_the_protocol_formulas():
    # decode tok/s = (n - 1) / (t_last - t_first); prefill tok/s = n_prompt / prefill time
    assert base.decode_tok_s([10.0, 10.5, 11.0, 12.0]) == pytest.approx(3 / 2.0)
    assert base.decode_tok_s([1.0, 2.0], batch=4) == pytest.approx(4.0)
    assert base.decode_tok_s([1.0]) is None
    assert base.prefill_tok_s(512, 0.25) == pytest.approx(2048.0)
    assert base.prefill_tok_s(512, 0.0) is None


def test_random_prompts_have_exact_length_and_avoid_special_ids():
    ids = base.random_token_ids(5000, 10, random.Random(1), excluded_ids=[0, 1, 2])
    assert len(ids) == 5000 and set(ids) == set(range(3, 10))


def test_unknown_engine_is_a_user_error():
    with pytest.raises(BenchcalError, match="did you mean: llama.cpp"):
        base.engine_class("llama.cp")


GRANDPARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(600)
"""


def test_kill_process_tree_leaves_no_descendant():
    proc = subprocess.Popen([sys.executable, "-c", GRANDPARENT], start_new_session=True)
    deadline = time.monotonic() + 10
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = psutil.Process(proc.pid).children()[0]
    kill_process_tree(proc, grace_s=1.0)
    assert proc.returncode is not None
    assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE


ALLOCATE = """
import time
time.sleep(0.3)
block = bytearray(300 * 2**20)  # zero-filled: every page touched
time.sleep(0.25)  # long enough for a loaded 2-core runner to sample it
del block
time.sleep(0.5)
"""


def test_rss_sampler_catches_a_short_allocation():
    proc = subprocess.Popen([sys.executable, "-c", ALLOCATE])
    sampler = RssTreeSampler(proc.pid).start()
    proc.wait(timeout=30)
    report = sampler.stop()
    assert report["peak_bytes"] >= 300 * 2**20
    assert report["sample_hz"] > 50 and report["sample_count"] > 20
    assert report["peak_time_s"] > 0.25  # after the child's first sleep
