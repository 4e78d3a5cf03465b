"""The server-id lock on SQLite and PostgreSQL: one holder per id, a live holder refuses a second one, a
stale or dead one is taken over by exactly one starter, and a holder taken over knows it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from capture_proxy.store import TraceStore
from capture_proxy.store.server_locks import ServerLockRecord
from harbor_server.errors import ServerIdInUse
from harbor_server.server_lock import STALE_BEATS, ProcessIdentity, ServerIdLock


def remote_holder(
    server_id: str, *, age_s: float, heartbeat_s: float = 1.0, token: str = "remote"
) -> ServerLockRecord:
    """A lock as a server on another machine writes it: its process cannot be looked at from here."""
    now = time.time()
    return ServerLockRecord(
        server_id=server_id, token=token, host="node-7", pid=4242, process_key="other-boot:pid:[1]/123",
        started_at=now - 100, heartbeat_at=now - age_s, heartbeat_s=heartbeat_s,
    )  # fmt: skip


def test_claim_beat_and_release_name_their_holder(store):
    locks = store.server_locks
    mine = remote_holder("s1", age_s=0)
    assert locks.claim(mine) is True
    assert locks.claim(remote_holder("s1", age_s=0, token="other")) is False  # nothing written
    assert locks.get("s1") == mine
    assert locks.beat("s1", "other", time.time()) is False  # only the holder beats
    assert locks.beat("s1", mine.token, mine.heartbeat_at + 1) is True
    assert locks.get("s1").heartbeat_at == mine.heartbeat_at + 1
    assert locks.release("s1", "other") is False
    assert locks.release("s1", mine.token) is True
    assert locks.get("s1") is None


def test_a_live_holder_refuses_a_second_server_and_keeps_its_lock(store):
    held = remote_holder("trainer-node", age_s=0.2)
    store.server_locks.claim(held)
    with pytest.raises(ServerIdInUse) as refused:
        ServerIdLock.acquire(store, "trainer-node", heartbeat_s=1.0)
    message = str(refused.value)
    assert (
        message
        == "server id 'trainer-node' is in use by a live server (pid 4242 on node-7, heartbeat 0 s ago)"
    )
    assert refused.value.flag == "--server-id"
    assert store.server_locks.get("trainer-node") == held


def test_a_stale_heartbeat_is_taken_over(store):
    store.server_locks.claim(remote_holder("trainer-node", age_s=STALE_BEATS * 1.0 + 1))
    lock = ServerIdLock.acquire(store, "trainer-node", heartbeat_s=1.0)
    assert lock.took_over is not None and "heartbeat is 4 s old" in lock.took_over
    now = store.server_locks.get("trainer-node")
    assert now.token == lock.record.token and now.pid == ProcessIdentity.current().pid
    lock.release()
    assert store.server_locks.get("trainer-node") is None


def test_a_holder_that_missed_a_beat_is_waited_for_until_it_is_stale(store):
    """A restarted server whose old process it cannot see (another container) starts once the old
    lock is stale, instead of being refused while it is only late."""
    store.server_locks.claim(remote_holder("late", age_s=1.6, heartbeat_s=1.0))
    started = time.monotonic()
    lock = ServerIdLock.acquire(store, "late", heartbeat_s=1.0)
    assert 1.0 < time.monotonic() - started < 5
    assert lock.took_over is not None
    lock.release()


def test_a_late_holder_that_beats_again_is_live(store):
    held = remote_holder("late", age_s=1.6, heartbeat_s=1.0)
    store.server_locks.claim(held)
    beat = threading.Timer(0.3, lambda: store.server_locks.beat("late", held.token, time.time()))
    beat.start()
    with pytest.raises(ServerIdInUse, match="in use by a live server"):
        ServerIdLock.acquire(store, "late", heartbeat_s=1.0)
    beat.join()


def test_a_dead_process_on_this_machine_is_taken_over_at_once(store_url, tmp_path):
    """As after SIGKILL: a real process takes the lock and is killed; its heartbeat is still fresh,
    but its process is gone, so a restart need not wait."""
    code = (
        "import sys, time; from capture_proxy.store import TraceStore; "
        "from harbor_server.server_lock import ServerIdLock; "
        "lock = ServerIdLock.acquire(TraceStore(sys.argv[1]), 'killed', heartbeat_s=60); "
        "print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, store_url], stdout=subprocess.PIPE, text=True)
    store = TraceStore(store_url)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ServerIdInUse, match=f"pid {holder.pid} "):
            ServerIdLock.acquire(store, "killed", heartbeat_s=60)
        holder.kill()
        holder.wait(timeout=30)
        started = time.monotonic()
        lock = ServerIdLock.acquire(store, "killed", heartbeat_s=60)
        assert time.monotonic() - started < 2
        assert (
            lock.took_over
            == f"pid {holder.pid} on {ProcessIdentity.current().host}: its process (pid {holder.pid}) is gone"
        )
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
        store.close()


def test_of_two_starters_on_one_stale_lock_exactly_one_wins(store_url):
    setup = TraceStore(store_url)
    setup.server_locks.claim(remote_holder("raced", age_s=60))
    setup.close()
    stores = [TraceStore(store_url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))
    outcomes: list[object] = []

    def start(store: TraceStore) -> None:
        barrier.wait()
        try:
            outcomes.append(ServerIdLock.acquire(store, "raced", heartbeat_s=1.0))
        except ServerIdInUse as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        winners = [o for o in outcomes if isinstance(o, ServerIdLock)]
        assert len(outcomes) == 4 and len(winners) == 1, outcomes
        assert stores[0].server_locks.get("raced").token == winners[0].record.token
    finally:
        for store in stores:
            store.close()


def test_the_heartbeat_keeps_a_lock_live_and_a_holder_taken_over_is_told(store):
    lock = ServerIdLock.acquire(store, "beating", heartbeat_s=0.2)
    lost = threading.Event()
    lock.keep_alive(on_lost=lost.set)
    try:
        first = store.server_locks.get("beating").heartbeat_at
        time.sleep(0.7)
        assert store.server_locks.get("beating").heartbeat_at > first
        # Another server takes it over (as after this one was suspended past the stale age).
        taker = remote_holder("beating", age_s=0, token="taker")
        assert store.server_locks.take_over(store.server_locks.get("beating"), taker)
        assert lost.wait(5) and lock.lost
    finally:
        lock.release()
    assert store.server_locks.get("beating").token == "taker"  # a lost lock is not released
