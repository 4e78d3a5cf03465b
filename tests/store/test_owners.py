"""Session owners: a store written before owners existed upgrades cleanly, and a restarting server
fails only its own (and owner-less) leftover sessions, never those of another server on the store."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.runtime.migration import MigrationContext

from capture_proxy.errors import InvalidSessionUpdate
from capture_proxy.store import TraceStore
from capture_proxy.store.engine import create_store_engine
from capture_proxy.store.migrate import alembic_config, head_revision

from .factories import make_session, make_turn


def _store_at_0001_with_a_running_session(store_url: str) -> None:
    engine = create_store_engine(store_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0001")
        with engine.begin() as conn:
            sessions = sa.Table("sessions", sa.MetaData(), autoload_with=conn)
            assert "owner" not in sessions.c
            conn.execute(
                sessions.insert(),
                [{
                    "session_id": "old", "api_key_hash": "a" * 64, "status": "running", "purpose": "train",
                    "model": "tiny", "llm_url": "http://127.0.0.1:9/v1", "upstream_api_key": None,
                    "sampling": {"temperature": 1.0}, "max_model_calls": 0, "multi_step_task": True,
                    "task_id": "t", "harness": "nop", "sandbox": "local", "reward": None, "rewards": {},
                    "error": None, "metadata": {"k": 1}, "created_at": time.time(), "finished_at": None,
                    "num_turns": 0,
                }],
            )  # fmt: skip
    finally:
        engine.dispose()


def test_a_store_at_0001_upgrades_and_keeps_its_sessions(store_url):
    _store_at_0001_with_a_running_session(store_url)
    store = TraceStore(store_url)  # opening migrates to head
    try:
        with store._engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == head_revision() == "0005"
        old = store.get_session("old")
        assert (old.owner, old.status, old.metadata, old.task_id) == (None, "running", {"k": 1}, "t")
        assert old.upstream_auth_header is None  # 0003: the Bearer default for rows written before it
        store.add_turn("old", 0, make_turn(0))  # the upgraded row takes turns as before
        assert store.get_session("old").num_turns == 1
        # A restarted server cannot tell who ran an owner-less session: it is a leftover to fail.
        assert store.mark_running_failed("restart", owner="host-a:8200") == 1
        assert store.get_session("old").status == "failed"
    finally:
        store.close()


def test_downgrade_to_0001_drops_the_owner_column(store_url):
    store = TraceStore(store_url)
    store.create_session(make_session("owned", owner="host-a:8200"))
    store.close()
    engine = create_store_engine(store_url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0001")
        with engine.connect() as conn:
            assert "owner" not in {c["name"] for c in sa.inspect(conn).get_columns("sessions")}
    finally:
        engine.dispose()
    store = TraceStore(store_url)  # and back up again
    assert store.get_session("owned").owner is None
    store.close()


def test_mark_running_failed_for_an_owner_leaves_other_owners_alone(store):
    for sid, owner, status in [
        ("mine", "host-a:8200", "running"),
        ("theirs", "host-b:8200", "running"),
        ("legacy", None, "running"),
        ("mine-done", "host-a:8200", "completed"),
    ]:
        store.create_session(make_session(sid, owner=owner, status=status))
    assert store.mark_running_failed("restart", owner="host-a:8200") == 2
    assert {sid: store.get_session(sid).status for sid in ("mine", "theirs", "legacy", "mine-done")} == {
        "mine": "failed", "theirs": "running", "legacy": "failed", "mine-done": "completed",
    }  # fmt: skip
    assert store.get_session("theirs").error is None
    assert store.mark_running_failed("restart", owner="host-a:8200") == 0


def test_owner_round_trips_and_is_set_once(store):
    store.create_session(make_session("s", owner="host-a:8200"))
    assert store.get_session("s").owner == "host-a:8200"
    assert [r.owner for r in store.list_sessions()] == ["host-a:8200"]
    with pytest.raises(InvalidSessionUpdate, match="owner"):
        store.update_session("s", owner="host-b:8200")
