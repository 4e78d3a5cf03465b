"""The process limits a server needs for the rollouts it admits.

Each live rollout holds open files for as long as it runs: its sandbox process's pipes, its agent's
connection to the capture port, the proxy's connection to the engine. bench/server_concurrency.py
(`--harness hold`) measured about 4 descriptors per live rollout on a local sandbox, and a server at
400 live rollouts hit the common default soft limit of 1024: 158 of its rollouts failed to start their
sandbox. The soft limit can be raised up to the hard one without privileges, so the server does that
at start-up, by what `max_concurrent_envs` needs, and warns with the numbers when the hard limit is too
low.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

BASE_OPEN_FILES = 256
"""The server itself: store, listening sockets, the trainer's connections, imported libraries."""
OPEN_FILES_PER_ROLLOUT = 8
"""Twice the measured 4 per live rollout: agents that stream, or run tools with pipes of their own."""


def open_files_needed(max_live_rollouts: int) -> int:
    return BASE_OPEN_FILES + OPEN_FILES_PER_ROLLOUT * max_live_rollouts


def ensure_open_file_limit(max_live_rollouts: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE (never lower it) to what `max_live_rollouts` needs, as far
    as the hard limit allows; returns the soft limit now in force."""
    needed = open_files_needed(max_live_rollouts)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("open-file limit raised from %d to %d for %d live rollouts", soft, target, max_live_rollouts)
    if target < needed:
        log.warning(
            "open-file limit %d (the hard limit) is below the %d that %d live rollouts need; rollouts may "
            "fail to start their sandboxes: raise it (`ulimit -Hn`, or LimitNOFILE= for a systemd unit) "
            "or lower --max-concurrent",
            target, needed, max_live_rollouts,
        )  # fmt: skip
    return max(target, soft)
