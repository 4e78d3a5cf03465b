"""A scratch PostgreSQL schema per test: the test database (HARBOR_TEST_POSTGRES_URL, which CI sets),
with the schema as the connection's search_path, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_ENV = "HARBOR_TEST_POSTGRES_URL"


@contextlib.contextmanager
def scratch_schema_url(prefix: str, why: str = "needs PostgreSQL") -> Iterator[str]:
    """The URL of a fresh schema named `<prefix>_<random>`; skips the test (saying `why`) without the
    variable."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{why}: set {PG_ENV} (e.g. postgresql+psycopg://user:pw@host/db)")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
