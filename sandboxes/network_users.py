"""Which live processes on this machine use a shared harbor-rl Docker network (`harbor-rl-nonet`, ...).

The Docker engine refuses to remove a network with containers attached, but a live server also uses
a network it has no container on at the moment: it has cached its gateway, forwards the capture port
there, and starts its next sandbox on it. Removing the network between two rollouts pulled it from
under that server. So each process that uses a shared network holds a shared `flock` on a file named
for it; a process that wants to remove the network first takes the lock exclusively, which succeeds
only when no other live process holds it, and keeps it while it removes (a server starting to use the
network meanwhile waits a moment). The kernel drops a process's locks when it dies, SIGKILL included,
so a crashed server never keeps a network alive.

The rule holds whatever store each server uses: it asks only which processes of this machine use the
network (a Docker engine serves the machine it runs on; its networks' gateways are on this machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_DIR = Path("/tmp/harbor-rl-docker-networks")
"""Fixed, not $TMPDIR: every process on the machine must find the same files."""


def _lock_path(name: str) -> Path:
    if not LOCK_DIR.is_dir():
        LOCK_DIR.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # any user's harbor-rl may lock here, as in /tmp itself
            LOCK_DIR.chmod(0o1777)
    return LOCK_DIR / f"{name}.lock"


def _open(name: str) -> int:
    fd = os.open(_lock_path(name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):  # another user's file: it is still lockable
        os.fchmod(fd, 0o666)
    return fd


class NetworkUsers:
    """This process's shared locks on the networks it uses (one per backend instance)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def hold(self, name: str) -> None:
        """Mark `name` as used by this process until `idle_only()` removes it (idempotent)."""
        if name in self._held:
            return
        fd = _open(name)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a remover holds it exclusively
        except BaseException:
            os.close(fd)
            raise
        self._held[name] = fd

    @contextlib.contextmanager
    def idle_only(self, name: str) -> Iterator[bool]:
        """Give up this process's use of `name` and yield whether no other live process uses it; while
        the block runs with True, nobody can start using it (remove the network there)."""
        fd = self._held.pop(name, None)
        if fd is not None:
            os.close(fd)  # drops our shared lock
        fd = _open(name)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False  # another live process holds it
                return
            yield True
        finally:
            os.close(fd)
