"""Every store test runs against SQLite and PostgreSQL.

The PostgreSQL variant needs HARBOR_TEST_POSTGRES_URL (CI sets it) and gives each test its own
schema (through the connection's search_path), dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from capture_proxy.store import TraceStore

PG_ENV = "HARBOR_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs' / 'traces.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. postgresql+psycopg://user:pw@host/db)")
    schema = f"store_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield (
            make_url(base)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def store(store_url: str) -> Iterator[TraceStore]:
    trace_store = TraceStore(store_url)
    yield trace_store
    trace_store.close()
