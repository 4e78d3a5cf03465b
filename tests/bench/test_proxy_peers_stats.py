"""How bench/proxy_peers.py turns its measurements into the numbers its verdict compares: CPU read from
/proc for real, rounds merged, and ratios paired within a round."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench._cpu import tree_cpu_ms
from bench.proxy_peers import Level, cpu_ratio, merge_rounds


def _level(cpu_rounds: list[float]) -> Level:
    """A 16-agent level measured in one round per CPU reading given."""
    return merge_rounds([Level(False, 16, requests=10, wall_s=1.0, cpu_ms=cpu) for cpu in cpu_rounds])


def test_rounds_pool_their_requests_and_take_the_median_rounds_cpu() -> None:
    first = Level(False, 16, requests=3, wall_s=1.0, latencies=[0.1, 0.2, 0.3], cpu_ms=0.9)
    slow = Level(False, 16, requests=2, wall_s=2.0, latencies=[0.4, 0.5], cpu_ms=3.0, failed=1,
                 first_failure="ReadTimeout")  # fmt: skip
    last = Level(False, 16, requests=4, wall_s=1.0, latencies=[0.1] * 4, cpu_ms=1.1)
    merged = merge_rounds([first, slow, last])
    assert (merged.requests, merged.wall_s, len(merged.latencies)) == (9, 4.0, 9)
    assert (merged.failed, merged.first_failure) == (1, "ReadTimeout")
    assert merged.cpu_rounds == [0.9, 3.0, 1.1]
    assert merged.cpu_ms == 1.1  # the slow round does not decide it


def test_cpu_ratio_pairs_the_targets_within_each_round() -> None:
    ours, theirs = _level([1.0, 2.0, 3.0]), _level([2.0, 10.0, 6.0])
    # Per round 0.5, 0.2, 0.5: the median is 0.5. The medians' ratio (2 / 6) would mix rounds.
    assert cpu_ratio(ours, theirs) == pytest.approx(0.5)


def test_cpu_ratio_above_a_floor_subtracts_it_in_each_round() -> None:
    ours, theirs, relay = _level([1.0, 0.8, 1.2]), _level([2.0, 2.4, 2.0]), _level([0.5, 0.4, 0.4])
    # Per round 0.5 / 1.5, 0.4 / 2.0, 0.8 / 1.6.
    assert cpu_ratio(ours, theirs, relay) == pytest.approx(1 / 3)


def test_cpu_ratio_of_levels_from_different_rounds_compares_their_cpu() -> None:
    ours, theirs = _level([1.0]), _level([2.0, 4.0, 3.0])
    assert cpu_ratio(ours, theirs) == pytest.approx(1 / 3)
    assert cpu_ratio(ours, Level(False, 16)) is None  # nothing measured on their side


def test_tree_cpu_ms_counts_this_process_cpu_finer_than_a_clock_tick() -> None:
    before = tree_cpu_ms(os.getpid())
    deadline = time.thread_time() + 0.025
    while time.thread_time() < deadline:
        pass
    spent = tree_cpu_ms(os.getpid()) - before
    assert 20 <= spent < 500
    if Path("/proc/self/schedstat").exists():
        assert spent != round(spent, -1)  # nanoseconds, not a multiple of 10 ms clock ticks


def test_tree_sampler_puts_each_process_in_its_part_and_children_in_their_parents() -> None:
    import subprocess
    import sys

    from bench._cpu import CPUByPart

    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.6: pass')"
    # The marked process burns 0.6 CPU-s and starts an unmarked child that burns as much: both are "agent".
    script = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {burn!r}]); {burn}; "
              "p.wait()")  # fmt: skip
    launch = "import os, subprocess, sys; subprocess.run([sys.executable, '-c', os.environ['S'], 'agent-' + 'marker'])"
    root = subprocess.Popen([sys.executable, "-c", launch], env={**os.environ, "S": script})

    def classify(pid: int, cmdline: str, parent: str | None) -> str:
        return "agent" if "agent-marker" in cmdline or parent == "agent" else "launcher"

    with CPUByPart(root.pid, classify, interval_s=0.05) as sampler:
        root.wait()
    parts = sampler.parts()
    assert 0.9 < parts["agent"] < 1.5, parts  # two 0.6 s burns, less what the last interval missed
    assert "launcher" in parts and parts["launcher"] < 0.3, parts  # the root, seen first
