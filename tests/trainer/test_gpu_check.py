"""bench/gpu_check.sh in its dry mode (CPU, small models, one step each): the prepared GPU check runs
the same code a GPU run does, so it cannot rot between the rare runs on a lent GPU machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_check_runs_dry_on_the_cpu() -> None:
    out = subprocess.run(["bash", "bench/gpu_check.sh", "--dry"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gpu check: OK (parameters on cpu in every case)" in out.stdout
    assert "tiny/packed" in out.stdout and "mid/padded" in out.stdout
