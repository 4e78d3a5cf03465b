"""Two `harbor train` runs in one output folder: the second is refused in one line, exit 2, before it
starts an engine, and the first keeps the folder. A SIGKILLed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in for a live run: the same lock `harbor train` takes, held by a process until it is killed.
HOLDER = """
import sys, time
from pathlib import Path
from harbor_rl.train_pipeline import owning_output_dir
with owning_output_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def _train(output: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harbor_rl", "train", "--output-dir", str(output), "--set", "max_steps=1"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip


def test_a_second_run_in_a_live_runs_folder_is_refused_in_one_line(tmp_path):
    output = tmp_path / "run"
    output.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(output)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        done = _train(output)
        took = time.monotonic() - started
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert done.returncode == 2, lines
        assert lines == [
            f"harbor train: {output} is in use by another harbor train (pid {holder.pid}); pass --output-dir "
            "to choose another"
        ]
        assert not (output / "engine.log").exists(), "refused before the engine started"
        print(f"refused in {took:.1f} s")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel released the killed holder's lock: the folder can be taken again at once.
    from harbor_rl.train_pipeline import owning_output_dir

    with owning_output_dir(output):
        assert (output / ".harbor-train.lock").read_text() == str(os.getpid())
