"""Every store test runs against SQLite and PostgreSQL.

The PostgreSQL variant needs HARBOR_TEST_POSTGRES_URL (CI sets it) and gives each test its own
schema (through the connection's search_path), dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from capture_proxy.store import TraceStore
from tests.postgres import scratch_schema_url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs' / 'traces.db'}"
        return
    with scratch_schema_url("store_test", why="PostgreSQL variant") as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[TraceStore]:
    trace_store = TraceStore(store_url)
    yield trace_store
    trace_store.close()
