"""Fixtures: a real `harbor serve` (HarborServer: uvicorn on two 127.0.0.1 ports, its own event loop
in a thread), a real SQLite trace store, the built-in tasks, the real `local` sandbox (bubblewrap).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harbor_server.config import ServeConfig
from harbor_server.embedded import ServerThread, free_port, running_server

__all__ = ["ServerThread", "free_port", "make_config", "running_server"]

UNUSED_ENGINE = "http://127.0.0.1:9/v1"
"""An engine URL nothing listens on: nop and oracle never call the model."""


def make_config(tmp_path: Path, **overrides) -> ServeConfig:
    values = {
        "datasets": ["builtin"],
        "llm_url": UNUSED_ENGINE,
        "model": "tiny",
        "port": free_port(),
        "capture_port": free_port(),
        "capture_host": "127.0.0.1",
        "sandbox": "local",
        "store_url": f"sqlite:///{tmp_path}/traces.db",
        "check_engine": False,
        "max_concurrent_envs": 8,
    }
    return ServeConfig(**(values | overrides))


@pytest.fixture
def sandbox_root(tmp_path, monkeypatch) -> Path:
    """Local sandboxes' folders under this test's tmp dir, so a leftover is visible and cleaned."""
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs" / "tmp" / "sandboxes"


@pytest.fixture
def server(tmp_path, sandbox_root) -> Iterator[ServerThread]:
    with running_server(make_config(tmp_path)) as thread:
        yield thread


@pytest.fixture
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c
