"""Opening a store: the default location, and clear errors for URLs and paths that cannot work."""

from __future__ import annotations

import asyncio
import os

import pytest

from capture_proxy.errors import StoreError
from capture_proxy.store import AsyncTurnWriter, TraceStore, default_store_url

from .factories import make_session, make_turn


def test_default_url_is_traces_db_in_runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "my runs"))
    assert default_store_url() == f"sqlite:///{tmp_path / 'my runs' / 'traces.db'}"
    store = TraceStore()
    store.create_session(make_session("here"))
    store.close()
    assert (tmp_path / "my runs" / "traces.db").is_file()


def test_default_runs_dir_is_relative_to_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("HARBOR_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_store_url() == f"sqlite:///{tmp_path / 'runs' / 'traces.db'}"


def test_sqlite_store_uses_wal(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path / 'wal.db'}")
    with store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.close()


async def test_in_memory_sqlite_works_across_threads():
    """One shared connection: the writer thread and reads from other threads take turns on it."""
    store = TraceStore("sqlite://")
    store.create_session(make_session("mem"))
    writer = AsyncTurnWriter(store)

    async def reader() -> None:
        for _ in range(20):
            await asyncio.to_thread(store.get_turns, "mem")

    await asyncio.gather(reader(), reader(), *(writer.write("mem", seq, make_turn(seq)) for seq in range(30)))
    await writer.aclose()
    assert store.get_turns("mem") == [make_turn(seq) for seq in range(30)]
    store.close()


def test_unwritable_path_is_a_store_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot create the folder for trace store"):
        TraceStore(f"sqlite:///{blocker / 'sub' / 'traces.db'}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere; permission bits do not stop it")
def test_read_only_folder_is_a_store_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not writable"):
            TraceStore(f"sqlite:///{folder / 'traces.db'}")
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "invalid trace store URL 'not a url'"),
        ("nosuchdb://host/db", "cannot use trace store URL 'nosuchdb://host/db'"),
    ],
)
def test_bad_url_is_a_store_error(url, message):
    with pytest.raises(StoreError, match=message):
        TraceStore(url)


def test_unreachable_database_is_a_store_error_without_the_password():
    # Port 1 on loopback: nothing listens, so the connection is refused at once.
    with pytest.raises(
        StoreError, match=r"cannot open trace store postgresql\+psycopg://u:\*\*\*@127.0.0.1:1/db"
    ) as info:
        TraceStore("postgresql+psycopg://u:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in str(info.value)


def test_new_sqlite_store_uses_large_pages(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path / 'pages.db'}")
    with store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 16_384
    store.close()
