"""The `server_locks` table: which `harbor serve` holds which server id on this store.

Only the store's side lives here: atomic claim, compare-and-set take-over, heartbeat and release, each
one transaction. Whether a holder is still alive (how old its heartbeat is, whether its process still
runs) is the server's judgement: harbor_server/server_lock.py.

Every write after the claim names the holder's random `token`, so two servers racing for one stale
lock cannot both win (the loser's compare-and-set matches no row), and a holder that was taken over
cannot beat or release its successor's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from capture_proxy.errors import StoreError
from capture_proxy.store.schema import ServerLockRow

Transaction = Callable[..., AbstractContextManager[Session]]
"""`TraceStore._transaction`: `transaction(write=...)` opens one transaction on the store's database."""

_locks = ServerLockRow.__table__


class ServerLockRecord(BaseModel):
    """One row of `server_locks`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server_id: str = Field(min_length=1, max_length=255)
    token: str = Field(min_length=1, max_length=64)
    host: str = Field(max_length=255)
    pid: int
    process_key: str = Field(max_length=255)
    started_at: float
    heartbeat_at: float
    """Unix time of the last heartbeat, by the holder's clock."""
    heartbeat_s: float = Field(gt=0)
    """The holder's heartbeat interval, seconds."""


class ServerLocks:
    """The lock rows of one TraceStore (`store.server_locks`), through the store's own transactions."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction

    def get(self, server_id: str) -> ServerLockRecord | None:
        with self._transaction(write=False) as s:
            row = s.execute(select(_locks).where(_locks.c.server_id == server_id)).mappings().one_or_none()
        return None if row is None else ServerLockRecord.model_validate(dict(row))

    def claim(self, record: ServerLockRecord) -> bool:
        """Insert the lock when no row holds its id; False when one does (nothing written)."""
        try:
            with self._transaction(write=True) as s:
                s.execute(insert(_locks).values(**record.model_dump()))
        except StoreError as exc:  # the store wraps driver errors; a taken key is an IntegrityError
            if isinstance(exc.__cause__, IntegrityError):
                return False
            raise
        return True

    def take_over(self, old: ServerLockRecord, new: ServerLockRecord) -> bool:
        """Replace `old` by `new` only if the row is still exactly `old`'s (same token, same heartbeat):
        a compare-and-set, so of two servers taking over one stale lock exactly one wins, and an owner
        that beat in the meantime keeps its lock."""
        query = (
            update(_locks)
            .where(
                _locks.c.server_id == old.server_id,
                _locks.c.token == old.token,
                _locks.c.heartbeat_at == old.heartbeat_at,
            )
            .values(**new.model_dump(exclude={"server_id"}))
        )
        with self._transaction(write=True) as s:
            return s.execute(query).rowcount == 1

    def beat(self, server_id: str, token: str, now: float) -> bool:
        """Refresh the holder's heartbeat; False when `token` no longer holds the id (taken over)."""
        query = (
            update(_locks)
            .where(_locks.c.server_id == server_id, _locks.c.token == token)
            .values(heartbeat_at=now)
        )
        with self._transaction(write=True) as s:
            return s.execute(query).rowcount == 1

    def release(self, server_id: str, token: str) -> bool:
        """Delete the lock if `token` still holds it."""
        query = delete(_locks).where(_locks.c.server_id == server_id, _locks.c.token == token)
        with self._transaction(write=True) as s:
            return s.execute(query).rowcount == 1
