"""The jobs folder (atomic files, resume checks, error kinds) and `harbor eval --compare`, on job
folders written through the same `Job` API the runner uses."""

from __future__ import annotations

import time

import pytest
from PIL import Image
from typer.testing import CliRunner

from evaluation.compare import compare_jobs
from evaluation.errors import JobConfigMismatch, JobNotFound
from evaluation.jobs import Job
from evaluation.models import EvalConfig, TrialResult, classify_error
from harbor_rl.cli import app


def _trial(task: str, attempt: int, reward: float | None) -> TrialResult:
    outcome = "error" if reward is None else ("pass" if reward >= 1.0 else "fail")
    now = time.time()
    return TrialResult(
        trial_id=f"builtin/{task}/{attempt}",
        split="builtin",
        task_id=task,
        attempt=attempt,
        status="completed",
        outcome=outcome,
        reward=reward,
        error_kind="verifier" if reward is None else None,
        started_at=now,
        finished_at=now,
    )


def _job(root, name: str, rewards: dict[str, list[float | None]]) -> Job:
    attempts = max(len(v) for v in rewards.values())
    job = Job.create_or_resume(root / name, EvalConfig(harness="oracle", attempts=attempts), resume=False)
    for task, values in rewards.items():
        for attempt, reward in enumerate(values):
            job.write_trial(_trial(task, attempt, reward))
    return job


def test_compare_lists_only_tasks_whose_outcome_changed(tmp_path):
    _job(tmp_path, "before", {"same": [1.0, 0.0], "fixed": [0.0, 0.0], "broke": [1.0, 1.0],
                              "errs": [1.0, None], "gone": [1.0, 1.0]})  # fmt: skip
    _job(tmp_path, "after", {"same": [0.0, 1.0], "fixed": [1.0, 0.0], "broke": [0.0, 1.0],
                             "errs": [None, None], "new": [1.0, 1.0]})  # fmt: skip
    changes = {c.task: c for c in compare_jobs(tmp_path / "before", tmp_path / "after")}
    assert {t: c.change for t, c in changes.items()} == {
        "builtin/fixed": "fixed",
        "builtin/broke": "broke",
        "builtin/errs": "now errors",
        "builtin/gone": "vanished",
        "builtin/new": "appeared",
    }
    assert (changes["builtin/fixed"].before, changes["builtin/fixed"].after) == (0.0, 0.5)
    result = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "before"), str(tmp_path / "after")])
    assert result.exit_code == 0, result.output
    assert "5 task(s) changed" in result.output and "builtin/broke" in result.output
    assert "builtin/same" not in result.output
    # And the picture of it, in the second job's folder: README-wide, a row per task.
    plot = tmp_path / "after" / "compare-before.png"
    assert f"plot: {plot}" in result.output
    assert Image.open(plot).size[0] == 1200


def test_compare_of_a_folder_that_is_no_job_is_an_error(tmp_path):
    _job(tmp_path, "a", {"t": [1.0]})
    with pytest.raises(JobNotFound, match="no config.json"):
        compare_jobs(tmp_path / "a", tmp_path / "missing")
    result = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no config.json" in result.output


def test_summary_counts_errors_apart_and_resume_checks_the_config(tmp_path):
    job = _job(tmp_path, "j", {"a": [1.0, None, 0.0], "b": [1.0, 1.0, 1.0]})
    summary = job.summarize(planned_trials=8, started_at=0.0, wall_time_s=1.5)
    assert not summary.complete and summary.outcomes == {"pass": 4, "fail": 1, "error": 1}
    assert summary.errors_by_kind == {"verifier": 1}
    assert summary.scores.pass_rate == pytest.approx(4 / 5)
    # pass@1: a = 1/2, b = 1; pass@2: a = 1 - C(1,2)/C(2,2) = 1 -> mean 1; pass@3: only b
    assert summary.scores.pass_at_k == pytest.approx({"1": 0.75, "2": 1.0, "3": 1.0})
    assert job.previous_wall_time() == 1.5
    with pytest.raises(JobConfigMismatch, match="attempts"):
        Job.create_or_resume(tmp_path / "j", EvalConfig(harness="oracle", attempts=5), resume=True)
    resumed = Job.create_or_resume(
        tmp_path / "j", EvalConfig(harness="oracle", attempts=3, n_concurrent=9), resume=True
    )
    assert len(resumed.trials()) == 6 and not list((tmp_path / "j").rglob(".*.json.*"))  # no temp files left
    # A trial the server never ran (kind `runner`) is run again on resume; every other one is final.
    refused = _trial("c", 0, None).model_copy(update={"error_kind": "runner"})
    resumed.write_trial(refused)
    assert ("builtin", "c", 0) not in resumed.finished_keys() and (
        "builtin",
        "a",
        1,
    ) in resumed.finished_keys()


@pytest.mark.parametrize(
    ("status", "scored", "error", "timed_out", "kind"),
    [
        ("completed", True, None, False, None),
        ("completed", False, "verifier gave no reward: no reward file", False, "verifier"),
        ("failed", False, "rollout unscoreable, a model call failed: 502", False, "model_call"),
        ("failed", False, "harness 'opencode' failed: exit 1", False, "harness"),
        ("failed", False, "sandbox 'docker' did not start: no image", False, "sandbox"),
        ("cancelled", False, "cancelled by request", False, "cancelled"),
        ("timed_out", False, "something else", True, "timeout"),
        ("failed", False, "RuntimeError: boom", False, "other"),
    ],
)
def test_error_kinds(status, scored, error, timed_out, kind):
    assert classify_error(status, scored, error, timed_out) == kind


def test_a_job_folder_of_the_earlier_layout_is_still_read_resumed_and_compared(tmp_path):
    """config.json holding the EvalConfig alone, trials in trials/<split>/<task>__<n>/result.json."""
    old = tmp_path / "old"
    (old / "trials" / "builtin" / "a__0").mkdir(parents=True)
    (old / "config.json").write_text(EvalConfig(harness="oracle", attempts=2).model_dump_json())
    trial = _trial("a", 0, 1.0)
    (old / "trials" / "builtin" / "a__0" / "result.json").write_text(trial.model_dump_json())
    job = Job.create_or_resume(old, EvalConfig(harness="oracle", attempts=2), resume=True)
    assert job.trials() == [trial] and job.finished_keys() == {("builtin", "a", 0)}
    job.write_trial(_trial("a", 1, 0.0))  # a resumed run writes its trials in Harbor's layout
    assert [t.attempt for t in Job.open(old).trials()] == [1, 0]
    summary = Job.open(old).summarize(planned_trials=2, started_at=0.0, wall_time_s=1.0)
    assert summary.complete and summary.scores.pass_rate == 0.5
    assert Job.open(old).file().eval.attempts == 2 and "harbor_rl" in (old / "config.json").read_text()
    _job(tmp_path, "new", {"a": [1.0, 1.0]})
    [change] = compare_jobs(old, tmp_path / "new")
    assert (change.task, change.before, change.after, change.change) == ("builtin/a", 0.5, 1.0, "fixed")
