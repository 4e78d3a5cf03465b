"""Both turn writers (thread and event loop): concurrent writes are committed once, in order, and durably
before write() returns."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from capture_proxy.errors import SessionNotFound, StoreError, TurnExists
from capture_proxy.store import AsyncTurnWriter, LoopTurnWriter, TraceStore, turn_writer

from .factories import make_session, make_turn


class BatchRecordingStore(TraceStore):
    """A real TraceStore that also remembers the size of each transaction the writer commits."""

    def __init__(self, url: str):
        super().__init__(url)
        self.batches: list[int] = []

    def add_turns(self, items):
        super().add_turns(items)
        self.batches.append(len(items))


@pytest.fixture(params=[AsyncTurnWriter, LoopTurnWriter], ids=["thread", "loop"])
def writer_cls(request: pytest.FixtureRequest) -> type:
    return request.param


def test_the_store_picks_the_loop_writer_for_sqlite_only(store):
    expected = LoopTurnWriter if store.url.startswith("sqlite") else AsyncTurnWriter
    assert type(turn_writer(store)) is expected


async def test_concurrent_writes_all_committed_once_and_in_order(store_url, writer_cls):
    store = BatchRecordingStore(store_url)
    sessions, turns_per_session = 24, 12
    for i in range(sessions):
        store.create_session(make_session(f"s{i:02d}"))
    writer = writer_cls(store, max_batch=64)

    async def agent(i: int) -> None:
        for seq in range(turns_per_session):  # an agent's calls are sequential
            await writer.write(f"s{i:02d}", seq, make_turn(i * 1000 + seq))

    await asyncio.gather(*(agent(i) for i in range(sessions)))
    await writer.aclose()

    assert sum(store.batches) == sessions * turns_per_session  # every turn committed exactly once
    assert max(store.batches) <= 64
    assert len(store.batches) < sessions * turns_per_session  # writes were grouped into fewer commits
    for i in range(sessions):
        assert store.get_turns(f"s{i:02d}") == [make_turn(i * 1000 + seq) for seq in range(turns_per_session)]
        assert store.get_session(f"s{i:02d}").num_turns == turns_per_session
    store.close()


async def test_a_bad_write_fails_alone(store, writer_cls):
    store.create_session(make_session("good"))
    writer = writer_cls(store)
    store.add_turn("good", 0, make_turn(0))
    results = await asyncio.gather(
        writer.write("good", 1, make_turn(1)),
        writer.write("ghost", 0, make_turn(2)),
        writer.write("good", 0, make_turn(3)),  # seq 0 is taken
        writer.write("good", 2, make_turn(4)),
        return_exceptions=True,
    )
    await writer.aclose()
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], SessionNotFound)
    assert isinstance(results[2], TurnExists)
    assert store.get_turns("good") == [make_turn(0), make_turn(1), make_turn(4)]


async def test_cancelled_waiter_still_gets_its_turn_stored(store, writer_cls):
    store.create_session(make_session("cancel"))
    writer = writer_cls(store)
    task = asyncio.create_task(writer.write("cancel", 0, make_turn(0)))
    await asyncio.sleep(0)  # the task has queued its turn and is waiting for the commit
    task.cancel()
    await writer.aclose()
    assert task.cancelled()
    assert store.get_turns("cancel") == [make_turn(0)]


async def test_closed_writer_refuses_writes(store, writer_cls):
    store.create_session(make_session("closed"))
    writer = writer_cls(store)
    await writer.write("closed", 0, make_turn(0))
    await writer.aclose()
    await writer.aclose()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await writer.write("closed", 1, make_turn(1))


def test_max_batch_must_be_positive(store, writer_cls):
    with pytest.raises(ValueError, match="max_batch"):
        writer_cls(store, max_batch=0)


_READ_IN_CHILD = textwrap.dedent(
    """
    import sys
    from capture_proxy.store import TraceStore
    turns = TraceStore(sys.argv[1]).get_turns(sys.argv[2])
    sys.stdout.write("\\n".join(t.model_dump_json() for t in turns))
    """
)

_WRITE_THEN_DIE = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from capture_proxy import store
    from tests.store.factories import make_turn

    async def main():
        writer = getattr(store, sys.argv[3])(store.TraceStore(sys.argv[1]))
        await writer.write(sys.argv[2], 0, make_turn(77))
        print("committed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush, no atexit: a crash

    asyncio.run(main())
    """
)


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60, cwd=_repo_root()
    )


def _repo_root() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


async def test_turn_is_visible_to_another_process_as_soon_as_write_returns(store, store_url, writer_cls):
    store.create_session(make_session("durable"))
    writer = writer_cls(store)
    await writer.write("durable", 0, make_turn(5))
    # No close, no flush: the other process must see the turn already.
    child = await asyncio.to_thread(_child, _READ_IN_CHILD, store_url, "durable")
    await writer.aclose()
    assert child.returncode == 0, child.stderr
    assert child.stdout == make_turn(5).model_dump_json()


def test_committed_turn_survives_a_writer_crash(store, store_url, writer_cls):
    store.create_session(make_session("crash"))
    child = _child(_WRITE_THEN_DIE, store_url, "crash", writer_cls.__name__)
    assert child.returncode == -9, child.stderr
    assert child.stdout == "committed\n"
    assert store.get_turns("crash") == [make_turn(77)]
    assert store.get_session("crash").num_turns == 1
