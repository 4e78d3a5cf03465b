"""The server raises its open-file limit for the rollouts it admits (harbor_server/limits.py). Each case
runs in a child process: the limit is process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harbor_server.limits import open_files_needed

CHILD = """
import logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from harbor_server.limits import ensure_open_file_limit
print(ensure_open_file_limit(int(sys.argv[3])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def run(soft: int, hard: int, live: int) -> tuple[list[int], str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(soft), str(hard), str(live)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(x) for x in done.stdout.split()], done.stderr


@pytest.fixture(autouse=True)
def _hard_limit_allows():
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this machine's hard open-file limit ({hard}) is below what the cases set")


def test_a_low_soft_limit_is_raised_to_what_400_live_rollouts_need() -> None:
    (returned, now), log = run(1024, 4096, 400)
    assert returned == now == open_files_needed(400) == 256 + 8 * 400
    assert "raised from 1024" in log


def test_a_limit_that_suffices_is_left_as_it_is() -> None:
    (returned, now), log = run(4096, 4096, 32)
    assert returned == now == 4096 and "raised" not in log


def test_a_hard_limit_below_the_need_is_used_whole_and_named() -> None:
    (returned, now), log = run(512, 2000, 400)
    assert returned == now == 2000
    assert "below the 3456 that 400 live rollouts need" in log and "--max-concurrent" in log
