"""CPU time of a benchmarked server process, read from /proc.

A thread's run time comes from `/proc/<pid>/task/<tid>/schedstat` in nanoseconds. `/proc/<pid>/stat`
counts it in clock ticks (10 ms), too coarse for a level that costs a proxy ~100 ms; it is the fallback
on kernels without schedstat.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from bench._sampling import PeriodicSampler

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


def _process_table() -> dict[int, list[str]]:
    """Every live process's /proc stat fields (after the command name), by pid."""
    table: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = _stat_fields(int(entry.name))
            except (OSError, IndexError):  # exited since the listing
                continue
    return table


def _children(table: dict[int, list[str]]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    return children


def tree_cpu_ms(pid: int) -> float:
    """CPU time of a process and its live descendants."""
    children = _children(_process_table())
    tree, frontier = {pid}, [pid]
    while frontier:
        kids = [p for p in children.get(frontier.pop(), ()) if p not in tree]
        tree.update(kids)
        frontier.extend(kids)
    total = 0.0
    for p in tree:
        try:
            total += process_cpu_ms(p)
        except OSError:
            continue
    return total


class CPUByPart(PeriodicSampler):
    """CPU seconds of a process tree by part, sampled from /proc every `interval_s` in a thread.
    `classify(pid, command line, parent's part)` names each process's part when it is first seen
    (parents are seen first), so an agent's shell commands can count as the agent. A process's last
    sample is its CPU: one that lives less than an interval is missed and one that exits loses up to an
    interval, so the parts' sum is a little under what the tree spent."""

    def __init__(self, pid: int, classify: Callable[[int, str, str | None], str], interval_s: float = 0.25):
        super().__init__(interval_s)
        self.pid = pid
        self._classify = classify
        self._part: dict[tuple[int, str], str] = {}
        self._cpu_s: dict[tuple[int, str], float] = {}

    def parts(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, seconds in self._cpu_s.items():
            out[self._part[key]] = out.get(self._part[key], 0.0) + seconds
        return out

    def tick(self) -> None:
        table = _process_table()
        if self.pid not in table:
            return
        children = _children(table)
        frontier: list[tuple[int, str | None]] = [(self.pid, None)]
        while frontier:
            pid, parent_part = frontier.pop()
            fields = table[pid]
            key = (pid, fields[19])  # pid and start time: a reused pid is another process
            if key not in self._part:
                self._part[key] = self._classify(pid, _cmdline(pid), parent_part)
            self._cpu_s[key] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
            frontier.extend((child, self._part[key]) for child in children.get(pid, ()))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
