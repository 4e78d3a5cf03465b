"""Disk full under the trace store, with the proxy answering agents: a clear error, the turns already
stored intact and readable, SQLite's integrity check clean, and the proxy recording again once space
is back (no restart).

The disk is a real 4 MiB tmpfs mounted for the test (root can mount here and in CI); where mounting
is not allowed, SQLite's `PRAGMA max_page_count` makes the database full instead (the same
SQLITE_FULL error). The engine is `engine.imitation`'s vLLM imitation (vLLM needs a GPU).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import event

from capture_proxy.store import TraceStore
from engine.imitation import create_imitation_app
from engine.in_process import serve_in_thread
from tests.proxy.conftest import ADMIN_KEY, Proxy, start_proxy
from tests.reliability.conftest import MODEL, assert_turns_complete, integrity_check

pytestmark = pytest.mark.timeout(180)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
BIG = "x" * 400_000
"""A prompt whose turn needs far more new pages than the WAL file already holds (~2.5 MB stored)."""


class FullDisk:
    """Makes the store's disk full and frees it again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.mounted = False
        self.store: TraceStore | None = None
        self._limit = None

    def mount(self) -> FullDisk:
        self.folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(self.folder)], capture_output=True
        )
        self.mounted = done.returncode == 0
        return self

    def fill(self) -> None:
        if not self.mounted:
            return self._cap_pages()
        with open(self.folder / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def free(self) -> None:
        if not self.mounted:
            assert self.store is not None
            event.remove(self.store._engine, "connect", self._limit)
            self.store._engine.dispose()
            return
        (self.folder / "filler").unlink()

    def _cap_pages(self) -> None:
        """No mount: cap the database at its current size on every connection the store opens."""
        assert self.store is not None
        engine = self.store._engine
        with engine.connect() as c:
            pages = c.exec_driver_sql("PRAGMA page_count").scalar()

        def limit(dbapi_connection, _record) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count={pages}")

        self._limit = limit
        event.listen(engine, "connect", limit)
        engine.dispose()

    def unmount(self) -> None:
        if os.path.ismount(self.folder):
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


@pytest.fixture
def disk(tmp_path) -> Iterator[FullDisk]:
    disk = FullDisk(tmp_path / "disk").mount()
    try:
        yield disk
    finally:
        disk.unmount()


def _chat(session, content: str, *, stream: bool = False) -> str:
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=120)
    messages = [{"role": "user", "content": content}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stream=stream)
    if stream:
        return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
    return reply.choices[0].message.content


def test_disk_full_gives_a_clear_error_and_corrupts_nothing(disk):
    db = disk.folder / "traces.db"
    store = TraceStore(f"sqlite:///{db}")
    disk.store = store
    try:
        with serve_in_thread(create_imitation_app()) as engine_url:

            class _Upstream:
                url = engine_url

            app, server = start_proxy(_Upstream, store)
            with server as url:
                proxy = Proxy(url, app.state.service, store)
                kept = proxy.create()
                for i in range(3):
                    assert _chat(kept, f"call {i}", stream=i == 1)
                before = [t.model_dump() for t in store.get_turns(kept.session_id)]

                disk.fill()
                with pytest.raises(openai.InternalServerError, match="trace store failed to record") as err:
                    _chat(kept, BIG)
                assert "full" in str(err.value)
                with pytest.raises(openai.APIError, match="trace store failed to record"):
                    _chat(kept, BIG, stream=True)
                spec = {"model": MODEL, "metadata": {"notes": BIG}}  # a session row that needs new pages
                created = httpx.post(f"{url}/sessions", json=spec, headers=ADMIN, timeout=60)
                assert created.status_code == 503, created.text
                assert "database or disk is full" in created.json()["error"]["message"]
                assert httpx.get(f"{url}/health", timeout=10).status_code == 200

                # What was stored before the disk filled is intact and readable, by a fresh reader too.
                reader = TraceStore(f"sqlite:///{db}")
                try:
                    assert [t.model_dump() for t in reader.get_turns(kept.session_id)] == before
                finally:
                    reader.close()
                assert_turns_complete(store, kept.session_id)
                assert integrity_check(db) == "ok"

                disk.free()
                assert _chat(kept, BIG[:2000])  # recording resumes without a restart
                assert assert_turns_complete(store, kept.session_id) == 4
    finally:
        store.close()
    assert integrity_check(db) == "ok"
