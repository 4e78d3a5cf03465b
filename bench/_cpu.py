"""CPU time of a benchmarked server process, read from /proc.

A thread's run time comes from `/proc/<pid>/task/<tid>/schedstat` in nanoseconds. `/proc/<pid>/stat`
counts it in clock ticks (10 ms), too coarse for a level that costs a proxy ~100 ms; it is the fallback
on kernels without schedstat.
"""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_ms(pid: int) -> float:
    """CPU time of a live process: its threads' run time (a thread that exits takes its time with it:
    the servers' thread pools keep theirs) plus its reaped children's."""
    fields = _stat_fields(pid)
    reaped_ns = (int(fields[13]) + int(fields[14])) * 10**9 // CLK_TCK  # cutime, cstime
    if not _SCHEDSTAT:
        return ((int(fields[11]) + int(fields[12])) * 10**9 // CLK_TCK + reaped_ns) / 1e6  # utime, stime
    threads_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            threads_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread has just exited
            continue
    return (threads_ns + reaped_ns) / 1e6


def tree_cpu_ms(pid: int) -> float:
    """CPU time of a process and its live descendants."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat_fields(int(entry.name))[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier.extend(children)
    total = 0.0
    for p in tree:
        try:
            total += process_cpu_ms(p)
        except OSError:
            continue
    return total
