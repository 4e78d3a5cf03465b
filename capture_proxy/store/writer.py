"""AsyncTurnWriter: durable turn writes that never block the event loop.

One writer thread owns all turn writes. Callers enqueue and await; the thread takes everything that
queued up while it was committing (up to `max_batch`) and commits it in one transaction, then wakes
every waiter. Under load this is group commit: one commit (and on PostgreSQL one fsync) for many turns;
when idle a lone write is committed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from dataclasses import dataclass

from capture_proxy.errors import StoreError
from capture_proxy.models import TrainingTurn
from capture_proxy.store.store import TraceStore


@dataclass(slots=True)
class _Pending:
    session_id: str
    seq: int
    turn: TrainingTurn
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


def _settle(batch: list[_Pending], error: BaseException | None) -> None:
    """Wake the batch's waiters: one hand-off per event loop, not one per turn (each wakes the loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for pending in batch:
        by_loop.setdefault(pending.loop, []).append(pending.future)
    for loop, futures in by_loop.items():
        # RuntimeError: the caller's loop has closed, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, futures, error)


def _resolve(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for future in futures:
        if future.done():  # the waiting task was cancelled; the turn is stored all the same
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


_STOP = object()


class AsyncTurnWriter:
    """Group-committing turn writer; `write()` returns once the turn is committed."""

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
            raise StoreError("AsyncTurnWriter is closed; no more turns can be written through it")
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
            self._commit(batch)  # type: ignore[arg-type]

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            self._store.add_turns([(p.session_id, p.seq, p.turn) for p in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch, exc)
                return
            # One bad turn (unknown session, duplicate seq) must not fail its neighbours: retry
            # one by one, so each waiter gets its own outcome.
            for pending in batch:
                self._commit([pending])
            return
        _settle(batch, None)
