"""Every test runs with its own empty user data directory: none reads or writes the user's runs or fits. Engine
tests share one cache of synthetic checkpoints and host probes per session (``cache``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_user_data(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path_factory.mktemp("benchcal-home")))
    monkeypatch.delenv("BENCHCAL_RUNS", raising=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """``$BENCHCAL_CACHE`` in the session's temporary directory: synthetic weights and host probes made once."""
    path = tmp_path_factory.getbasetemp() / "benchcal-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENCHCAL_CACHE", str(path))
        yield path
