"""Turn writers: durable turn writes for the proxy, committed before `write()` returns.

Two ways to commit, one contract (`TurnWriter`):
- `AsyncTurnWriter`: one writer thread owns all turn writes. Callers enqueue and await; the thread
  takes everything that queued up while it was committing (up to `max_batch`) and commits it in one
  transaction, then wakes every waiter. Under load this is group commit: one commit (and on
  PostgreSQL one fsync) for many turns; when idle a lone write is committed at once. For stores
  behind a network, whose commits wait on round trips the event loop must not wait on.
- `LoopTurnWriter`: commits on the caller's event loop, once per loop iteration, all the turns that
  iteration's calls recorded. For a local SQLite store, whose commit is tens of microseconds of C:
  handing it to a thread cost the proxy more CPU than the commit itself (the two threads pass the GIL
  back and forth around every SQLite call: ~0.7 ms of proxy CPU a call at one agent, measured A/B).

`turn_writer(store)` picks the one that suits the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from capture_proxy.errors import StoreError
from capture_proxy.models import TrainingTurn
from capture_proxy.store.store import TraceStore


class TurnWriter(Protocol):
    async def write(self, session_id: str, seq: int, turn: TrainingTurn) -> None:
        """Store one turn; returns once it is committed, raises the store's error if it was not."""

    async def aclose(self) -> None:
        """Commit everything already written, then refuse further writes. Safe to call twice."""


@dataclass(slots=True)
class _Pending:
    session_id: str
    seq: int
    turn: TrainingTurn
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _commit(store: TraceStore, batch: list[_Pending], settle: Callable[[list[_Pending], BaseException | None], None]) -> None:  # fmt: skip
    """Commit `batch` in one transaction and settle its waiters. One bad turn (unknown session,
    duplicate seq) must not fail its neighbours: a failed batch is retried one turn at a time, so
    each waiter gets its own outcome."""
    try:
        store.add_turns([(p.session_id, p.seq, p.turn) for p in batch])
    except Exception as exc:
        if len(batch) == 1:
            settle(batch, exc)
            return
        for pending in batch:
            _commit(store, [pending], settle)
        return
    settle(batch, None)


def _resolve(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # the waiting task was cancelled; the turn is stored all the same
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _settle_threadsafe(batch: list[_Pending], error: BaseException | None) -> None:
    """Wake the batch's waiters: one hand-off per event loop, not one per turn (each wakes the loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for pending in batch:
        by_loop.setdefault(pending.loop, []).append(pending.future)
    for loop, futures in by_loop.items():
        # RuntimeError: the caller's loop has closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, futures, error)


def _settle_here(batch: list[_Pending], error: BaseException | None) -> None:
    _resolve([p.future for p in batch], error)


def _closed_error(name: str) -> StoreError:
    return StoreError(f"{name} is closed; no more turns can be written through it")


_STOP = object()


class AsyncTurnWriter:
    """Group-committing turn writer on a thread of its own; `write()` returns once the turn is committed."""

    def __init__(self, store: TraceStore, *, max_batch: int = 256):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._store = store
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[_Pending | object] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="harbor-turn-writer", daemon=True)
        self._thread.start()

    async def write(self, session_id: str, seq: int, turn: TrainingTurn) -> None:
        """Store one turn; returns once it is committed, raises the store's error if it was not."""
        if self._closed:
            raise _closed_error(type(self).__name__)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._queue.put(_Pending(session_id, seq, turn, loop, future))
        await future

    async def aclose(self) -> None:
        """Commit everything already queued, then stop the thread. Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)
            _commit(self._store, batch, _settle_threadsafe)  # type: ignore[arg-type]


class LoopTurnWriter:
    """Group-committing turn writer on the caller's event loop: the turns written during one loop
    iteration are committed together as soon as that iteration's ready callbacks have run."""

    def __init__(self, store: TraceStore, *, max_batch: int = 256):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._store = store
        self._max_batch = max_batch
        self._pending: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
        self._closed = False

    async def write(self, session_id: str, seq: int, turn: TrainingTurn) -> None:
        """Store one turn; returns once it is committed, raises the store's error if it was not."""
        if self._closed:
            raise _closed_error(type(self).__name__)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        pending.append(_Pending(session_id, seq, turn, loop, future))
        await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        pending = self._pending.pop(loop, None) or []
        for start in range(0, len(pending), self._max_batch):
            _commit(self._store, pending[start : start + self._max_batch], _settle_here)

    async def aclose(self) -> None:
        """Commit everything already written. Safe to call twice."""
        self._closed = True
        self._flush(asyncio.get_running_loop())
        await asyncio.sleep(0)  # let the waiters just settled run before the caller goes on


def turn_writer(store: TraceStore) -> AsyncTurnWriter | LoopTurnWriter:
    """The writer that costs `store` least: on the event loop for SQLite (a local C call), on a
    thread for a database across a network."""
    return LoopTurnWriter(store) if store.is_sqlite else AsyncTurnWriter(store)


__all__ = ["AsyncTurnWriter", "LoopTurnWriter", "TurnWriter", "turn_writer"]
