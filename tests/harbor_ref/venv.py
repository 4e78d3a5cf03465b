"""Find Harbor's venv (made by scripts/setup.sh) and run code in it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HARBOR_VERSION = "0.26.0"
"""The release the differential tests read (pinned in scripts/setup.sh too)."""
DEFAULT_VENV = Path.home() / ".cache" / "harbor-rl" / f"harbor-{HARBOR_VERSION}-venv"
_HERE = Path(__file__).parent


def harbor_python() -> Path:
    """The interpreter of Harbor's venv ($HARBOR_REF_VENV, else the set-up's default); skips the test,
    naming the set-up step, when it is missing."""
    venv = Path(os.environ.get("HARBOR_REF_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"Harbor {HARBOR_VERSION} is not installed in {venv}: run scripts/setup.sh")
    return python


def run_in_harbor(script: str, *args: str, timeout_s: float = 300.0) -> str:
    """Run one of this folder's scripts with Harbor's interpreter; its stdout, or an assertion naming
    what it printed on failure."""
    done = subprocess.run(
        [str(harbor_python()), str(_HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert done.returncode == 0, f"{script} failed in Harbor's venv:\n{done.stderr[-4000:]}"
    return done.stdout


def dump_tasks(folders: list[Path], env: dict[str, str] | None = None) -> dict[str, dict]:
    """Harbor's reading of each task folder: {folder: {"ok", "error", "config", "name", ...}}."""
    out = run_in_harbor("load.py", json.dumps({"folders": [str(f) for f in folders], "env": env or {}}))
    return {row["folder"]: row for row in map(json.loads, out.splitlines())}


def validate_job(folder: Path) -> dict:
    """What Harbor's own models and validators say of a job folder (`validate_job.py`): {"errors": [...],
    "trials", "trajectories", "agent_steps", ...}; errors is empty when Harbor reads all of it."""
    return json.loads(run_in_harbor("validate_job.py", str(folder)))


def validate_trajectory(path: Path) -> list[str]:
    """Harbor's errors for one ATIF trajectory file (its model, then its TrajectoryValidator); [] if valid."""
    return json.loads(run_in_harbor("validate_job.py", "--trajectory", str(path)))["errors"]
