"""A read-only SQLAlchemy engine on a trace store.

The inspector never writes: SQLite files are opened with `mode=ro` (and `query_only`), PostgreSQL
sessions are `READ ONLY`; other backends get `query_only`-free engines and are trusted not to be written
because no code path here issues a write. The schema must already be the store's current revision:
migrating is the writer's job (the proxy or server), never the inspector's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from capture_proxy.store.engine import redact
from capture_proxy.store.migrate import current_revision, head_revision
from inspector.errors import StoreUnavailable

SQLITE_BUSY_TIMEOUT_MS = 5_000


def _sqlite_path(url: URL) -> Path | None:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser().resolve()


def _sqlite_readonly_engine(path: Path, shown: str) -> Engine:
    if not path.is_file():
        raise StoreUnavailable(f"trace store {shown}: no such file {path}")

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only=ON")
        return conn

    return create_engine("sqlite://", creator=connect, json_deserializer=orjson.loads, pool_pre_ping=False)


def _readonly_postgres(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Every transaction on this connection refuses writes, whatever a caller does.
        cursor = dbapi_connection.cursor()
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        cursor.close()
        dbapi_connection.commit()


def open_readonly(url: str) -> Engine:
    """An engine that can only read the store at `url`, checked to be at the current schema revision."""
    shown = redact(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreUnavailable(f"invalid trace store URL {shown!r}: {exc}") from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = _sqlite_path(parsed)
        if path is None:
            raise StoreUnavailable(
                f"trace store {shown}: the inspector reads a SQLite file; an in-memory database "
                "belongs to the process that made it"
            )
        engine = _sqlite_readonly_engine(path, shown)
    else:
        try:
            engine = create_engine(parsed, json_deserializer=orjson.loads, pool_pre_ping=True)
        except Exception as exc:  # unknown dialect, missing driver
            raise StoreUnavailable(f"cannot use trace store URL {shown!r}: {exc}") from exc
        if backend == "postgresql":
            _readonly_postgres(engine)
    try:
        _check_schema(engine, shown)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _check_schema(engine: Engine, shown: str) -> None:
    try:
        with engine.connect() as conn:
            revision = current_revision(conn)
    except SQLAlchemyError as exc:
        raise StoreUnavailable(f"cannot read trace store {shown}: {type(exc).__name__}: {exc}") from exc
    head = head_revision()
    if revision is None:
        raise StoreUnavailable(
            f"trace store {shown} has no trace tables yet: start the proxy or `harbor serve` on it first"
        )
    if revision != head:
        raise StoreUnavailable(
            f"trace store {shown} is at schema revision {revision!r}, this inspector reads {head!r}: "
            "open it once with the proxy or server of this version (they migrate it), or upgrade harbor-rl"
        )
