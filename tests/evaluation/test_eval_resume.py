"""A `harbor eval` process killed (SIGKILL) halfway, then resumed, ends with exactly one result per
trial and no session left `running` in its store: the real CLI in a subprocess, the real local
sandbox, a real SQLite store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from capture_proxy.store import TraceStore
from evaluation.jobs import Job
from tasks import load_dataset_spec

pytestmark = pytest.mark.timeout(600)
GLOBS = ["--task", "fix-*", "--task", "lru-cache", "--task", "parse-dotenv"]
HARBOR = [sys.executable, "-m", "harbor_rl"]
"""The CLI of this checkout (a `harbor` console script may belong to another install)."""


def _running(store_url: str) -> list[str]:
    store = TraceStore(store_url)
    try:
        return [s.session_id for s in store.list_sessions(status="running", limit=1000)]
    finally:
        store.close()


def test_killed_run_resumes_with_one_result_per_trial(tmp_path, runs_dir, store_url):
    jobs = tmp_path / "jobs"
    args = [*HARBOR, "eval", "--harness", "oracle", "-k", "2",
            "--max-concurrent", "2", *GLOBS, "--output-dir", str(jobs), "--job-name", "killed", "--store", store_url]  # fmt: skip
    planned = {
        (t, a) for t in ("fix-csv-export", "fix-pagination", "lru-cache", "parse-dotenv") for a in range(2)
    }
    assert {t for t, _ in planned} <= set(load_dataset_spec("builtin").ids)
    env = dict(os.environ, HARBOR_RUNS_DIR=str(runs_dir))
    # Its own process group: the kill takes the sandboxes' processes with it, as a crash would.
    proc = subprocess.Popen(
        args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    job_dir = jobs / "killed"
    deadline = time.monotonic() + 300
    while len(list(job_dir.glob("*/result.json"))) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no trial finished in time"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    done_before = {(t.task_id, t.attempt): t.rollout_id for t in Job.open(jobs / "killed").trials()}
    assert 3 <= len(done_before) < len(planned), "the kill came too late to test resuming"
    assert not (jobs / "killed" / "result.json").exists()
    killed_running = _running(store_url)
    assert killed_running, "the kill left no trial running: nothing to mark"

    resumed = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=500)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(done_before)} already finished" in resumed.stderr.replace("\n", " ")
    # The killed run's sessions are failed with a reason, not `running` forever.
    assert _running(store_url) == []
    assert f"marked {len(killed_running)} session(s) a killed run" in resumed.stderr.replace("\n", " ")
    store = TraceStore(store_url)
    try:
        for session_id in killed_running:
            record = store.get_session(session_id)
            assert record.status == "failed" and "stopped while this rollout was running" in record.error
    finally:
        store.close()
    trials = Job.open(jobs / "killed").trials()
    keys = Counter((t.task_id, t.attempt) for t in trials)
    assert set(keys) == planned and set(keys.values()) == {1}
    # Trials finished before the kill were kept, not run again.
    for trial in trials:
        if (trial.task_id, trial.attempt) in done_before:
            assert trial.rollout_id == done_before[(trial.task_id, trial.attempt)]
    summary = (jobs / "killed" / "result.json").read_text()
    assert '"complete": true' in summary and '"pass_rate": 1.0' in summary
