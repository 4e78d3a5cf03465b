"""The trace store: capture sessions and their turns, durable as soon as each turn is written.

SQLite (WAL) by default at $HARBOR_RUNS_DIR/traces.db; any SQLAlchemy URL works, PostgreSQL
(`postgresql+psycopg://`) when several machines write. The schema is migrated with Alembic on open.
"""

from capture_proxy.store.engine import as_store_url, default_store_url, runs_dir
from capture_proxy.store.records import ROLLOUT_KEY, SessionRecord
from capture_proxy.store.store import TraceStore
from capture_proxy.store.writer import AsyncTurnWriter, LoopTurnWriter, TurnWriter, turn_writer

__all__ = [
    "ROLLOUT_KEY",
    "AsyncTurnWriter",
    "LoopTurnWriter",
    "SessionRecord",
    "TraceStore",
    "TurnWriter",
    "as_store_url",
    "default_store_url",
    "runs_dir",
    "turn_writer",
]
