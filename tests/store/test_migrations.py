"""The Alembic migrations build exactly the schema the ORM declares, and opening a store migrates it."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from capture_proxy.errors import StoreError
from capture_proxy.store import TraceStore
from capture_proxy.store.engine import create_store_engine
from capture_proxy.store.migrate import alembic_config, head_revision
from capture_proxy.store.schema import Base


def test_migrated_schema_matches_orm_metadata(store):
    with store._engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == head_revision()


def test_downgrade_to_base_and_upgrade_again(store_url):
    TraceStore(store_url).close()
    engine = create_store_engine(store_url)
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    with engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
    engine.dispose()

    store = TraceStore(store_url)  # opening migrates back to head
    with store._engine.connect() as conn:
        assert {"sessions", "turns"} <= set(inspect(conn).get_table_names())
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    store.close()


def test_concurrent_first_opens_migrate_once(store_url):
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            TraceStore(store_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_opening_a_sqlite_file_another_connection_is_writing_waits_for_it(tmp_path):
    # SQLite refuses the switch to WAL at once ("database is locked", no busy wait) while another
    # connection holds the write lock: what a second process opening a store as the first creates
    # it ran into.
    path = tmp_path / "traces.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE written_first (a)")
    committer = threading.Timer(0.3, holder.execute, ("COMMIT",))
    committer.start()
    started = time.monotonic()
    store = TraceStore(f"sqlite:///{path}")
    waited = time.monotonic() - started
    committer.join()
    holder.close()
    store.close()
    assert waited >= 0.25
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"written_first", "sessions", "turns"} <= tables


def test_unknown_revision_is_refused(store_url):
    TraceStore(store_url).close()
    engine = create_store_engine(store_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'from_the_future'"))
    engine.dispose()
    with pytest.raises(StoreError, match="revision 'from_the_future'.*upgrade harbor-rl"):
        TraceStore(store_url)
