"""The tables of the trace store: one row per capture session, one row per captured turn, and one per
`harbor serve` id in use (its lock, kept alive by a heartbeat).

Token arrays are binary columns (see codec.py); request, response and metadata are JSON, written
with orjson by the engine's serializer. On PostgreSQL the JSON columns are `json`, not `jsonb`: `json`
keeps the text as sent (key order, number spelling) and accepts `\\u0000`, which `jsonb` rejects and
which binary-ish tool output does contain.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Explicit constraint names, so migrations can name what they alter on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SessionRow(Base):
    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    api_key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """sha256 hex of the agent's session key; the key itself is never stored."""
    status: Mapped[str] = mapped_column(String(16))
    purpose: Mapped[str] = mapped_column(String(8))
    model: Mapped[str] = mapped_column(Text)
    llm_url: Mapped[str] = mapped_column(Text)
    upstream_api_key: Mapped[str | None] = mapped_column(Text)
    upstream_auth_header: Mapped[str | None] = mapped_column(String(128))
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON)
    max_model_calls: Mapped[int] = mapped_column(Integer)
    multi_step_task: Mapped[bool] = mapped_column(Boolean)
    task_id: Mapped[str | None] = mapped_column(String(255))
    harness: Mapped[str | None] = mapped_column(String(64))
    sandbox: Mapped[str | None] = mapped_column(String(64))
    reward: Mapped[float | None] = mapped_column(Double)
    rewards: Mapped[dict[str, float]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON)
    created_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    num_turns: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str | None] = mapped_column(String(255))
    """The server that runs the session (its server id); None for sessions written before owners
    were recorded (schema 0001) or by a writer that names none."""

    __table_args__ = (
        # Every listing is newest first, optionally filtered by one of these.
        Index("ix_sessions_created_at", "created_at"),
        Index("ix_sessions_status_created_at", "status", "created_at"),
        Index("ix_sessions_purpose_created_at", "purpose", "created_at"),
        Index("ix_sessions_task_id_created_at", "task_id", "created_at"),
    )


class TurnRow(Base):
    __tablename__ = "turns"

    session_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("sessions.session_id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    """Order of the call within its session; (session_id, seq) is the primary key, hence unique."""
    node_id: Mapped[str] = mapped_column(Text)
    prompt_base_seq: Mapped[int | None] = mapped_column(Integer)
    """The earlier turn of this session this one is stored against (prefix.py): its prompt starts with
    `prompt_shared_len` tokens of that turn's prompt + completion, its request with `request_shared`
    of that turn's messages."""
    prompt_shared_len: Mapped[int] = mapped_column(Integer)
    """How many leading prompt tokens come from that turn; 0 without one."""
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)
    """The prompt tokens after the shared prefix (the whole prompt when there is no base)."""
    completion_ids: Mapped[bytes] = mapped_column(LargeBinary)
    logps: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes] = mapped_column(LargeBinary)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON)
    request_shared: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """How many leading request messages come from the base turn's request (compact.py); `request`
    holds the rest. 0 for rows written before revision 0004."""
    response_elided: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    """Which response fields are stored as null and rebuilt from the arrays (compact.Elided flags)."""

    __table_args__ = (
        # A prompt's base turn exists in the same session, and goes when it goes.
        ForeignKeyConstraint(
            ["session_id", "prompt_base_seq"], ["turns.session_id", "turns.seq"], ondelete="CASCADE"
        ),
    )


class ServerLockRow(Base):
    """A `harbor serve` that holds its server id on this store: one row per id, written when the server
    starts, its heartbeat refreshed while it runs, deleted when it stops (harbor_server/server_lock.py)."""

    __tablename__ = "server_locks"

    server_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))
    """Random per holder: every heartbeat and the release are compare-and-set on it, so a holder whose
    lock was taken over can no longer touch the row."""
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    process_key: Mapped[str] = mapped_column(String(255))
    """Which process exactly (boot id, pid namespace, start time): on the same machine, a holder whose
    process is gone is known dead without waiting for its heartbeat to go stale."""
    started_at: Mapped[float] = mapped_column(Double)
    heartbeat_at: Mapped[float] = mapped_column(Double)
    """Unix time of the holder's last heartbeat, by the holder's clock."""
    heartbeat_s: Mapped[float] = mapped_column(Double)
    """The holder's heartbeat interval: its lock is stale after a few of them without a beat."""
