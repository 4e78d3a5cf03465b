"""Building the SQLAlchemy engine for a store URL: SQLite tuned for many small durable writes,
anything else as SQLAlchemy makes it."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from capture_proxy.errors import StoreError

WRITE_OPTION = "harbor_write"
"""Execution option marking a connection that will write: on SQLite its transaction starts with
BEGIN IMMEDIATE, so a read-then-write transaction waits for the lock instead of failing with
SQLITE_BUSY when another writer got there first."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_PAGE_SIZE = 16_384


def runs_dir() -> Path:
    """Where a run keeps its files: $HARBOR_RUNS_DIR, or ./runs."""
    return Path(os.environ.get("HARBOR_RUNS_DIR") or "runs").expanduser().resolve()


def default_store_url() -> str:
    """sqlite:///<runs dir>/traces.db."""
    return f"sqlite:///{runs_dir() / 'traces.db'}"


def as_store_url(spec: str) -> str:
    """A `--store` value as a SQLAlchemy URL: a URL as given, a plain file path (no `scheme://`) as the
    SQLite file it names (`runs/traces.db` -> `sqlite:////abs/runs/traces.db`)."""
    if "://" in spec:
        return spec
    return f"sqlite:///{Path(spec).expanduser().resolve()}"


def redact(url: str | URL) -> str:
    """The URL as safe to print: the password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def _json_dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:  # a value JSON cannot hold (bytes, a set, a non-str key, a huge int)
        raise StoreError(f"cannot store a value as JSON: {exc}") from exc


def _sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL, or None for an in-memory or URI-style database."""
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:") or url.query.get("uri"):
        return None
    return Path(database).expanduser()


def _prepare_sqlite_dir(path: Path, shown: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the folder for trace store {shown}: {exc}") from exc
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise StoreError(f"trace store {shown} is not writable: no write permission on {target}")


def _enable_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the database file to WAL (a setting the file keeps). Connections opening a new file at
    the same moment race to switch it, and SQLite answers a loser "database is locked" at once,
    without waiting in its busy handler (4 threads opening a new store at once on a loaded machine:
    one of them failed in 1 try of 60). So retry, within the busy timeout, until this connection or
    the winner has switched it; a later attempt finds it switched and costs nothing."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


def _tune_sqlite(engine: Engine, *, in_memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN; pysqlite's own implicit BEGIN cannot
        # be made IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if not in_memory:
            # Only takes effect when the file is created (a no-op afterwards): turns are tens of KB,
            # and 16 KiB pages mean fewer overflow pages per row; ingest measured ~1.5x faster.
            cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
            # WAL: readers never block the writer; NORMAL: a commit survives a process crash
            # (not a power cut) without an fsync per commit.
            _enable_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        immediate = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_store_engine(url: str) -> Engine:
    """An engine for `url`; raises StoreError naming the URL when it is malformed or unusable."""
    shown = redact(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"invalid trace store URL {shown!r}: {exc}") from exc
    kwargs: dict[str, Any] = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}
    is_sqlite = parsed.get_backend_name() == "sqlite"
    sqlite_file = _sqlite_file(parsed) if is_sqlite else None
    if is_sqlite and sqlite_file is None:
        # One shared connection: otherwise each pooled connection would open its own empty database.
        kwargs |= {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    elif not is_sqlite:
        kwargs["pool_pre_ping"] = True  # survive a database restart between writes
    if sqlite_file is not None:
        _prepare_sqlite_dir(sqlite_file, shown)
    try:
        engine = create_engine(parsed, **kwargs)
    except Exception as exc:  # unknown dialect, missing driver, bad arguments
        raise StoreError(f"cannot use trace store URL {shown!r}: {exc}") from exc
    if is_sqlite:
        _tune_sqlite(engine, in_memory=sqlite_file is None)
    return engine
