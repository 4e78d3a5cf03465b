"""A `harbor eval` process killed (SIGKILL) halfway, then resumed, ends with exactly one result per
trial: the real CLI in a subprocess, the real local sandbox, a real SQLite store."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter

import pytest

from evaluation.jobs import Job
from tasks import load_dataset_spec

pytestmark = pytest.mark.timeout(600)
GLOBS = ["--task-glob", "fix-*", "--task-glob", "lru-cache", "--task-glob", "parse-dotenv"]
HARBOR = shutil.which("harbor") or "harbor"


def test_killed_run_resumes_with_one_result_per_trial(tmp_path, runs_dir, store_url):
    jobs = tmp_path / "jobs"
    args = [HARBOR, "eval", "--harness", "oracle", "-k", "2",
            "--n-concurrent", "2", *GLOBS, "--jobs-dir", str(jobs), "--job-name", "killed", "--store", store_url]  # fmt: skip
    planned = {
        (t, a) for t in ("fix-csv-export", "fix-pagination", "lru-cache", "parse-dotenv") for a in range(2)
    }
    assert {t for t, _ in planned} <= set(load_dataset_spec("builtin").ids)
    env = dict(os.environ, HARBOR_RUNS_DIR=str(runs_dir))
    # Its own process group: the kill takes the sandboxes' processes with it, as a crash would.
    proc = subprocess.Popen(
        args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    trials_dir = jobs / "killed" / "trials"
    deadline = time.monotonic() + 300
    while len(list(trials_dir.glob("*/*/result.json"))) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no trial finished in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    done_before = {(t.task_id, t.attempt): t.rollout_id for t in Job.open(jobs / "killed").trials()}
    assert 3 <= len(done_before) < len(planned), "the kill came too late to test resuming"
    assert not (jobs / "killed" / "result.json").exists()

    resumed = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=500)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(done_before)} already finished" in resumed.stderr.replace("\n", " ")
    trials = Job.open(jobs / "killed").trials()
    keys = Counter((t.task_id, t.attempt) for t in trials)
    assert set(keys) == planned and set(keys.values()) == {1}
    # Trials finished before the kill were kept, not run again.
    for trial in trials:
        if (trial.task_id, trial.attempt) in done_before:
            assert trial.rollout_id == done_before[(trial.task_id, trial.attempt)]
    summary = (jobs / "killed" / "result.json").read_text()
    assert '"complete": true' in summary and '"pass_rate": 1.0' in summary
