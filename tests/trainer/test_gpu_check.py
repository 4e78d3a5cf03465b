"""bench/gpu_check.sh in its dry mode (CPU, small models, one step each): the prepared GPU check runs
the same code a GPU run does, so it cannot rot between the rare runs on a lent GPU machine.

The dry run itself is CI's: .ci/run's `python -m bench --quick` runs `bench/gpu_check.py --quick` (the
same flag as `--dry`; a failing benchmark fails CI), so the test suite no longer runs it a second time
(25 s on 2 cores). Here: that it stays in the quick suite, and that the wrapper still starts it."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_dry_in_cis_quick_suite_and_its_wrapper_starts_it() -> None:
    from bench import KNOWN

    gpu_check = next(b for b in KNOWN if b.name == "gpu_check")
    assert gpu_check.in_quick and gpu_check.needs_gpu
    out = subprocess.run(["bash", "bench/gpu_check.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "--dry, --quick" in out.stdout
