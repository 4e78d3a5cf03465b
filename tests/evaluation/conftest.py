"""Fixtures for eval and collect: sandboxes and the trace store under the test's tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def runs_dir(tmp_path, monkeypatch) -> Path:
    """HARBOR_RUNS_DIR for this test: local sandboxes' folders and the default store live here."""
    path = tmp_path / "runs"
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(path))
    return path


@pytest.fixture
def store_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/traces.db"
