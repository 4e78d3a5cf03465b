"""One live server per server id on a store: a lock row with a heartbeat.

At start-up a server fails the rollouts its id left `running` (a crash or SIGKILL leaves them so).
That sweep is only right when no live server holds the id: a second `harbor serve` with the same id
(the default `<hostname>:<port>` on a busy port, or the same `--server-id`) used to fail the first
one's live rollouts. So, before sweeping, a server claims its id in the store's `server_locks` table
and beats its heartbeat every `heartbeat_s` seconds from a thread of its own (a busy event loop does
not make it look dead); on a clean stop it deletes the row.

A held lock is taken over when its holder is gone:
- its heartbeat is older than STALE_BEATS intervals (the holder's own interval, as recorded), or
- its holder is a process of this machine (same boot, same pid namespace) that no longer runs: a
  SIGKILLed server restarted at once need not wait for its heartbeat to go stale.
A holder that missed a beat but is not yet stale is waited for, up to the stale age: a server
restarted where its old process cannot be seen (a new container) starts once the old lock is stale.

The take-over is a compare-and-set on (token, heartbeat) in the store (capture_proxy/store/
server_locks.py): of two servers starting at once on one stale lock, exactly one wins. Ages compare
the starter's clock with the holder's: machines sharing a PostgreSQL store need clocks within a few
seconds of each other (NTP), or a live lock may look stale.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from capture_proxy.errors import StoreError
from capture_proxy.store import TraceStore
from capture_proxy.store.server_locks import ServerLockRecord
from harbor_server.errors import ServerIdInUse

log = logging.getLogger(__name__)

STALE_BEATS = 3
"""A lock whose heartbeat is older than this many of its holder's intervals is stale."""
MISSED_BEATS = 1.5
"""A heartbeat older than this many intervals missed a beat: worth waiting for it to go stale."""


@dataclass(frozen=True)
class ProcessIdentity:
    """A process, precisely enough to tell on the same machine whether it still runs (a pid alone may
    have been reused by then)."""

    pid: int
    host: str
    machine: str
    """Boot id and pid namespace: two processes with the same `machine` see the same pids."""
    start_ticks: str
    """The process's start time in clock ticks since boot (/proc/<pid>/stat, field 22)."""

    @property
    def key(self) -> str:
        return f"{self.machine}/{self.start_ticks}"

    @classmethod
    def current(cls) -> ProcessIdentity:
        pid = os.getpid()
        return cls(
            pid=pid, host=socket.gethostname(), machine=_machine(), start_ticks=_start_ticks(pid) or ""
        )

    def sees(self, process_key: str) -> bool:
        """Whether the process `process_key` names is on this machine and in this pid namespace."""
        machine, _, _ = process_key.rpartition("/")
        return bool(self.machine) and machine == self.machine

    @staticmethod
    def runs(pid: int, process_key: str) -> bool:
        """Whether the process (seen from this machine) still runs: the same pid with the same start
        time, and not a zombie."""
        return _start_ticks(pid) == process_key.rpartition("/")[2]


def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""  # no /proc: never judge a lock by its process, only by its heartbeat


def _start_ticks(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat; None when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name (field 2) may hold spaces
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def why_stale(record: ServerLockRecord, now: float, me: ProcessIdentity) -> str | None:
    """Why the lock's holder counts as gone, or None while it counts as live."""
    age = now - record.heartbeat_at
    if age > STALE_BEATS * record.heartbeat_s:
        return f"its heartbeat is {age:.0f} s old"
    if me.sees(record.process_key) and not me.runs(record.pid, record.process_key):
        return f"its process (pid {record.pid}) is gone"
    return None


class ServerIdLock:
    """The lock this server holds on its id; `acquire()` it, `keep_alive()`, `release()` on stop."""

    def __init__(self, store: TraceStore, record: ServerLockRecord, *, took_over: str | None = None) -> None:
        self.store = store
        self.record = record
        self.took_over = took_over
        """Why a previous holder's lock was taken over (None: the id was free)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    @classmethod
    def acquire(cls, store: TraceStore, server_id: str, *, heartbeat_s: float) -> ServerIdLock:
        """Claim `server_id`, taking over a stale lock; ServerIdInUse (nothing written) when a live
        server holds it."""
        me = ProcessIdentity.current()
        locks = store.server_locks
        token = secrets.token_hex(16)
        started = time.time()
        waited = False
        while True:
            now = time.time()
            mine = ServerLockRecord(
                server_id=server_id, token=token, host=me.host, pid=me.pid, process_key=me.key,
                started_at=started, heartbeat_at=now, heartbeat_s=heartbeat_s,
            )  # fmt: skip
            if locks.claim(mine):
                return cls(store, mine)
            held = locks.get(server_id)
            if held is None:
                continue  # released between the two
            reason = why_stale(held, now, me)
            if reason is None:
                age = now - held.heartbeat_at
                if waited or age <= MISSED_BEATS * held.heartbeat_s:
                    raise ServerIdInUse(_in_use(held, age), flag="--server-id")
                # It missed a beat: wait once until it is stale (or beats again, and is live).
                time.sleep(max(STALE_BEATS * held.heartbeat_s - age, 0) + 0.05)
                waited = True
                continue
            if locks.take_over(held, mine):
                log.warning(
                    "server id %r: took over the lock of pid %d on %s (%s)",
                    server_id,
                    held.pid,
                    held.host,
                    reason,
                )
                return cls(store, mine, took_over=f"pid {held.pid} on {held.host}: {reason}")
            # Another starter won the race, or the holder beat: look again (it is live now).

    def keep_alive(self, on_lost: Callable[[], None]) -> None:
        """Beat every `heartbeat_s` from a daemon thread; `on_lost()` (from that thread) once another
        server has taken the lock over. A store that does not answer is logged and retried."""

        def beat() -> None:
            interval = self.record.heartbeat_s
            while not self._stop.wait(interval):
                try:
                    held = self.store.server_locks.beat(self.record.server_id, self.record.token, time.time())
                except StoreError as exc:
                    log.warning("server id %r: heartbeat not recorded: %s", self.record.server_id, exc)
                    continue
                if not held:
                    self.lost = True
                    log.error(
                        "server id %r: another server took this server's lock over", self.record.server_id
                    )
                    on_lost()
                    return

        self._thread = threading.Thread(target=beat, name="harbor-server-lock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop beating and delete the lock (if it is still ours)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        if self.lost:
            return
        with contextlib.suppress(StoreError):  # a store gone by now: the lock goes stale on its own
            self.store.server_locks.release(self.record.server_id, self.record.token)


def _in_use(held: ServerLockRecord, age: float) -> str:
    return (
        f"server id {held.server_id!r} is in use by a live server (pid {held.pid} on {held.host}, "
        f"heartbeat {max(age, 0):.0f} s ago)"
    )
