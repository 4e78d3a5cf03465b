"""Alembic environment of the trace store.

TraceStore runs migrations itself (capture_proxy/store/migrate.py) and hands its connection in
`config.attributes["connection"]`. From the command line, run from the repository root:

    alembic -c capture_proxy/store/alembic.ini -x url=sqlite:///runs/traces.db upgrade head
    alembic -c capture_proxy/store/alembic.ini -x url=... revision --autogenerate -m "what changed"
"""

from __future__ import annotations

import logging

from alembic import context

from capture_proxy.store.engine import create_store_engine, default_store_url
from capture_proxy.store.schema import Base

target_metadata = Base.metadata


def _configure_and_run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode recreates the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s [%(name)s] %(message)s"
    )  # CLI run: show steps
    url = context.get_x_argument(as_dictionary=True).get("url") or default_store_url()
    engine = create_store_engine(url)
    try:
        with engine.connect() as conn:
            _configure_and_run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("the trace store has no offline (SQL script) migrations; run them against a database")
run_migrations_online()
