"""`harbor eval` end to end on the real `local` sandbox (bubblewrap) with a real in-process Harbor
server and SQLite trace store: oracle scores 1.0, nop 0.0, with complete result files; a verifier that
writes no reward is an error, not a failure; results are capture sessions the inspector can list."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capture_proxy.store import TraceStore
from evaluation.jobs import Job
from evaluation.models import TrialResult
from harbor_rl.cli import app
from tasks import BUILTIN_DIR, load_dataset_spec

pytestmark = pytest.mark.timeout(600)
TRIAL_FIELDS = {"task_id", "attempt", "reward", "rewards", "timings", "tokens", "tool_calls_by_name", "error"}


def _eval(*args: str) -> None:
    result = CliRunner().invoke(app, ["eval", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("harness", "expected"), [("oracle", 1.0), ("nop", 0.0)])
def test_sanity_harnesses_on_every_builtin_task(tmp_path, runs_dir, store_url, harness, expected):
    jobs = tmp_path / "jobs"
    _eval("--harness", harness, "--output-dir", str(jobs), "--job-name", harness, "--max-concurrent", "4",
          "--store", store_url)  # fmt: skip
    job = Job.open(jobs / harness)
    tasks = load_dataset_spec("builtin").ids
    trials = job.trials()
    assert sorted(t.task_id for t in trials) == sorted(tasks)
    for trial in trials:
        raw = json.loads((job.trial_dir("builtin", trial.task_id, 0) / "result.json").read_text())["harbor_rl"]
        assert set(raw) >= TRIAL_FIELDS, raw
        assert trial.reward == expected and trial.error is None, trial
        assert set(trial.timings) >= {"sandbox_start", "agent", "verifier", "total"}
    summary = json.loads(job.result_path.read_text())["harbor_rl"]
    assert summary["complete"] and summary["planned_trials"] == len(tasks)
    assert summary["scores"]["pass_rate"] == expected
    assert summary["scores"]["pass_at_k"] == {"1": expected}
    assert summary["scores"]["mean_reward"] == expected and summary["scores"]["reward_se"] == 0.0
    assert summary["errors_by_kind"] == {} and summary["wall_time_s"] > 0
    # Every trial is a capture session in the trace store (what the inspector lists).
    store = TraceStore(store_url)
    try:
        for trial in trials:
            record = store.get_session(trial.rollout_id)
            assert (record.purpose, record.task_id, record.harness, record.reward) == (
                "eval",
                trial.task_id,
                harness,
                expected,
            )
    finally:
        store.close()


def _task_without_reward(root: Path) -> Path:
    """A copy of a built-in task whose test script never writes a reward file."""
    task = root / "tasks" / "no-reward"
    shutil.copytree(BUILTIN_DIR / "fix-pagination", task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'verifier broke before scoring' >&2\nexit 0\n")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('name = "harbor-rl/fix-pagination"', 'name = "harbor-rl/no-reward"'))
    return task.parent


def test_verifier_failure_is_an_error_not_a_failure(tmp_path, runs_dir):
    dataset = _task_without_reward(tmp_path)
    result = CliRunner().invoke(app, ["eval", "--dataset", str(dataset), "--harness", "oracle", "-k", "2",
                                      "-o", str(tmp_path / "jobs"), "--job-name", "broken"])  # fmt: skip
    # Every trial errored: the run fails, and says why (the error itself, not only its kind).
    assert result.exit_code == 1, result.output
    assert "all 2 trials errored" in result.output
    assert "2 x verifier: verifier gave no reward" in result.output
    job = Job.open(tmp_path / "jobs" / "broken")
    trials = job.trials()
    assert len(trials) == 2
    assert all(t.outcome == "error" and t.reward is None and t.error_kind == "verifier" for t in trials)
    summary = json.loads(job.result_path.read_text())["harbor_rl"]
    assert summary["errors_by_kind"] == {"verifier": 2}
    [(message, count)] = summary["errors_by_message"].items()
    assert count == 2 and message.startswith("verifier: verifier gave no reward")
    assert summary["outcomes"] == {"error": 2}
    scores = summary["scores"]
    assert (scores["scored"], scores["passed"], scores["errors"]) == (0, 0, 2)
    assert scores["pass_rate"] is None and scores["pass_at_k"] == {}  # no 0.0: nothing was scored
    # Without --store the capture sessions live in the job folder's own store.
    store = TraceStore(f"sqlite:///{job.root / 'traces.db'}")
    try:
        assert {store.get_session(t.rollout_id).reward for t in trials} == {None}
    finally:
        store.close()


def test_resume_of_a_finished_job_runs_nothing_and_a_changed_config_is_refused(tmp_path, runs_dir, store_url):
    args = ["--harness", "oracle", "--task", "fix-p*", "--output-dir", str(tmp_path / "jobs"),
            "--job-name", "j", "--store", store_url]  # fmt: skip
    _eval(*args)
    first = Job.open(tmp_path / "jobs" / "j").trials()
    _eval(*args, "--resume")
    assert Job.open(tmp_path / "jobs" / "j").trials() == first
    # --resume without --job-name continues the latest job of the jobs folder.
    no_name = [a for a in args if a not in ("--job-name", "j")]
    _eval(*no_name, "--resume")
    assert (
        Job.open(tmp_path / "jobs" / "j").trials() == first and len(list((tmp_path / "jobs").iterdir())) == 1
    )
    result = CliRunner().invoke(app, ["eval", *args, "-k", "2", "--resume"])
    assert result.exit_code == 1 and "attempts" in result.output
    result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 1 and "--resume" in result.output
    assert isinstance(first[0], TrialResult)


def test_a_refused_task_is_listed_and_the_others_run(tmp_path, runs_dir, store_url):
    """One malformed task in a folder never blocks the rest; with --task it is not even mentioned;
    --strict refuses the whole job in one line."""
    tasks = tmp_path / "tasks"
    shutil.copytree(BUILTIN_DIR / "fix-pagination", tasks / "fix-pagination")
    shutil.copytree(BUILTIN_DIR / "lru-cache", tasks / "broken")
    (tasks / "broken" / "task.toml").write_text('[environment]\ncpus = "lots"\n')
    base = ["eval", "--dataset", str(tasks), "--harness", "oracle", "--store", store_url]
    run = CliRunner().invoke(app, [*base, "--output-dir", str(tmp_path / "j1"), "--job-name", "a"])
    assert run.exit_code == 0, run.output
    assert "refused tasks/broken" in run.output and "[environment] cpus" in run.output
    assert [t.task_id for t in Job.open(tmp_path / "j1" / "a").trials()] == ["fix-pagination"]
    filtered = CliRunner().invoke(app, [*base, "--output-dir", str(tmp_path / "j2"), "--task", "fix-*"])
    assert filtered.exit_code == 0 and "broken" not in filtered.output
    strict = CliRunner().invoke(app, [*base, "--output-dir", str(tmp_path / "j3"), "--strict"])
    assert strict.exit_code != 0 and "'broken' is refused" in strict.output
    assert "Traceback" not in strict.output
