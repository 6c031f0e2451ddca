"""Every test runs with its own empty user data directory: none reads or writes the user's runs or fits."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_user_data(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("BENCHCAL_HOME", str(tmp_path_factory.mktemp("benchcal-home")))
    monkeypatch.delenv("BENCHCAL_RUNS", raising=False)
