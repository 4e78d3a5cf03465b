"""Sessions: create, look up, list, update with status rules, and recovery after a crash."""

from __future__ import annotations

import hashlib
import threading

import pytest

from capture_proxy.errors import InvalidSessionUpdate, SessionNotFound, StoreError
from capture_proxy.store import TraceStore

from .factories import make_session, make_turn


def test_session_round_trips(store):
    record = make_session(
        "full",
        purpose="eval",
        upstream_api_key="sk-upstream",
        sampling={"temperature": 0.6, "top_p": 1.0, "seed": None},
        max_model_calls=40,
        multi_step_task=True,
        task_id="fix-the-bug",
        harness="mini-swe-agent",
        sandbox="docker",
        metadata={"episode": 7, "tags": ["a", "b"]},
        created_at=1795990000.000001,
    )
    store.create_session(record)
    assert store.get_session("full") == record


def test_unknown_session_raises(store):
    with pytest.raises(SessionNotFound, match="'nope'"):
        store.get_session("nope")


def test_session_id_and_key_hash_are_unique(store):
    store.create_session(make_session("one"))
    with pytest.raises(StoreError, match="already in use"):
        store.create_session(make_session("one"))
    clash = make_session("two", api_key_hash=store.get_session("one").api_key_hash)
    with pytest.raises(StoreError, match="already in use"):
        store.create_session(clash)


def test_find_session_by_key_hash(store):
    record = make_session("keyed")
    store.create_session(record)
    assert store.find_session_by_key_hash(record.api_key_hash) == record
    assert store.find_session_by_key_hash(hashlib.sha256(b"someone else").hexdigest()) is None


def test_list_sessions_newest_first_with_filters(store):
    specs = [
        ("a", "running", "train", "t1"),
        ("b", "completed", "train", "t1"),
        ("c", "failed", "eval", "t2"),
        ("d", "running", "eval", "t1"),
        ("e", "completed", "train", None),
    ]
    for i, (sid, status, purpose, task) in enumerate(specs):
        store.create_session(
            make_session(sid, status=status, purpose=purpose, task_id=task, created_at=1000.0 + i)
        )

    def ids(**filters):
        return [r.session_id for r in store.list_sessions(**filters)]

    assert ids() == ["e", "d", "c", "b", "a"]
    assert ids(status="running") == ["d", "a"]
    assert ids(status=["completed", "failed"]) == ["e", "c", "b"]
    assert ids(purpose="eval") == ["d", "c"]
    assert ids(task_id="t1") == ["d", "b", "a"]
    assert ids(task_id="t1", purpose="train", status="running") == ["a"]
    assert ids(limit=2) == ["e", "d"]
    assert ids(limit=2, offset=2) == ["c", "b"]
    assert ids(offset=10) == []


def test_update_session_sets_fields_and_stamps_finish(store):
    store.create_session(make_session("upd"))
    updated = store.update_session("upd", status="completed", reward=0.5, rewards={"tests": 0.5}, error=None)
    assert updated.status == "completed"
    assert updated.reward == 0.5
    assert updated.finished_at is not None
    assert store.get_session("upd") == updated

    # A reward can still arrive after the session finished, and re-stating the status is a no-op.
    later = store.update_session(
        "upd", status="completed", reward=None, metadata={"verifier": "no reward file"}
    )
    assert later.reward is None
    assert later.finished_at == updated.finished_at
    assert store.get_session("upd").metadata == {"verifier": "no reward file"}


def test_update_session_keeps_given_finished_at(store):
    store.create_session(make_session("given"))
    assert store.update_session("given", status="timed_out", finished_at=1234.5).finished_at == 1234.5


def test_finished_status_is_final(store):
    store.create_session(make_session("final"))
    store.update_session("final", status="cancelled")
    for status in ("running", "completed"):
        with pytest.raises(InvalidSessionUpdate, match="already 'cancelled'"):
            store.update_session("final", status=status)
    assert store.get_session("final").status == "cancelled"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"colour": "red"}, r"cannot update field\(s\) \['colour'\]"),
        ({"num_turns": 5}, r"cannot update field\(s\) \['num_turns'\]"),
        ({"session_id": "other"}, r"cannot update field\(s\) \['session_id'\]"),
        ({"status": "paused"}, "invalid update"),
        ({"max_model_calls": -1}, "invalid update"),
    ],
)
def test_bad_updates_are_rejected(store, fields, message):
    store.create_session(make_session("strict"))
    with pytest.raises(InvalidSessionUpdate, match=message):
        store.update_session("strict", **fields)
    assert store.get_session("strict") == make_session(
        "strict", created_at=store.get_session("strict").created_at
    )


def test_update_unknown_session_raises(store):
    with pytest.raises(SessionNotFound):
        store.update_session("ghost", status="failed")


def test_mark_running_failed(store):
    for sid, status in [("r1", "running"), ("r2", "running"), ("done", "completed")]:
        store.create_session(make_session(sid, status=status))
    assert store.mark_running_failed("proxy restarted") == 2
    for sid in ("r1", "r2"):
        record = store.get_session(sid)
        assert (record.status, record.error) == ("failed", "proxy restarted")
        assert record.finished_at is not None
    assert store.get_session("done").status == "completed"
    assert store.get_session("done").error is None
    assert store.mark_running_failed("again") == 0


def test_concurrent_updates_and_turns_from_two_stores(store, store_url):
    """Two stores (two engines, as two processes would have) update one session while turns arrive:
    no 'database is locked', no lost num_turns."""
    store.create_session(make_session("busy"))
    other = TraceStore(store_url)
    errors: list[BaseException] = []

    def updater(target, worker: int) -> None:
        try:
            for i in range(15):
                target.update_session("busy", metadata={"worker": worker, "i": i})
        except BaseException as exc:
            errors.append(exc)

    def adder(target, start: int) -> None:
        try:
            for seq in range(start, start + 15):
                target.add_turn("busy", seq, make_turn(seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [
        *(threading.Thread(target=updater, args=(target, i)) for i, target in enumerate([store, other] * 2)),
        threading.Thread(target=adder, args=(store, 0)),
        threading.Thread(target=adder, args=(other, 100)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    other.close()
    assert errors == []
    assert store.get_session("busy").num_turns == 30
    assert len(store.get_turns("busy")) == 30


def test_new_session_cannot_claim_turns(store):
    with pytest.raises(StoreError, match="num_turns=3"):
        store.create_session(make_session("claims", num_turns=3))
    with pytest.raises(SessionNotFound):
        store.get_session("claims")
