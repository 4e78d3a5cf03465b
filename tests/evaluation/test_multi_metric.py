"""Several metrics per trial (a reward.json with no `reward` key is a valid result), from RolloutResults
built in code and written through the runner's own functions: the summary reports every metric, pass@k
only on a chosen one, and never counts such a trial as an error or as 0; Harbor's package reads the
folder and computes the same job stats (its Mean over every key, its pass@k rule, its error policy)."""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from capture_proxy.episodes import Episode
from evaluation.collect import CollectConfig, build_episode, should_keep
from evaluation.harbor_format import TaskConfig
from evaluation.jobs import Job
from evaluation.models import EvalConfig
from evaluation.rollouts import RolloutOutcome
from evaluation.runner import TaskFacts, Trial, results_table, trial_result
from harbor_server.models import RolloutResult, StepResult
from tests.harbor_ref import validate_job

MODEL_CALL_FAILED = "rollout unscoreable, a model call failed: engine answered 502"
NO_REWARD_FILE = "verifier gave no reward: the verifier wrote no /logs/verifier/reward.json or reward.txt"


def rollout(
    n: int, *, env_reward=None, rewards=None, error=None, status="completed", steps=()
) -> RolloutOutcome:
    result = RolloutResult(
        rollout_id=f"r{n}",
        status=status,
        env_reward=env_reward,
        rewards=rewards or {},
        error=error,
        timings={"sandbox_start": 0.5, "agent": 2.0, "verifier": 1.0, "total": 3.6},
        steps=list(steps),
        verifier_output="2 passed\n",
    )
    return RolloutOutcome(result=result, turns=[])


PLAN = {
    "multi": [  # cookbook-style: correctness and performance, no `reward` key
        rollout(1, rewards={"correctness": 1.0, "performance": 0.5}),
        rollout(2, rewards={"correctness": 0.0, "performance": 1.0}),
    ],
    "single": [
        rollout(3, env_reward=1.0, rewards={"reward": 1.0}),
        rollout(4, env_reward=0.0, rewards={"reward": 0.0}),
    ],
    "broken": [  # a model call failed (the metrics it left do not count), and a verifier wrote nothing
        rollout(
            5, rewards={"correctness": 1.0, "performance": 1.0}, error=MODEL_CALL_FAILED, status="failed"
        ),
        rollout(6, error=NO_REWARD_FILE),
    ],
}


def write_job(root, reward_key: str | None = None) -> Job:
    config = EvalConfig(
        harness="mini-swe-agent", model="m", llm_url="http://x/v1", attempts=2, reward_key=reward_key
    )
    tasks = [TaskConfig(path=str(root / "tasks" / t), source="builtin") for t in PLAN]
    job = Job.create_or_resume(root / "job", config, resume=False, tasks=tasks)
    for task, outcomes in PLAN.items():
        facts = TaskFacts(name=f"demo/{task}", path=str(root / "tasks" / task), checksum="0" * 64)
        for attempt, outcome in enumerate(outcomes):
            job.begin_trial("builtin", task, attempt, facts.path)
            job.write_trial(
                trial_result(Trial("builtin", task, attempt), outcome, time.time(), config, facts)
            )
    return job


def _caption(summary) -> str:
    console = Console(width=200, record=True)
    console.print(results_table(summary))
    return console.export_text()


def test_several_metrics_are_reported_and_pass_at_k_waits_for_a_reward_key(tmp_path):
    job = write_job(tmp_path)
    summary = job.summarize(planned_trials=6, started_at=time.time(), wall_time_s=1.0)
    assert summary.outcomes == {"scored": 2, "pass": 1, "fail": 1, "error": 2}
    s = summary.scores
    assert (s.trials, s.scored, s.passed, s.errors, s.metrics_only) == (6, 2, 1, 2, 2)
    assert (
        s.pass_rate == 0.5 and s.pass_at_k == {"1": 0.5, "2": 1.0} and s.pass_at_k_tasks == {"1": 1, "2": 1}
    )
    # Every metric, over the scored trials that report it; the failed model call's metrics are not among them.
    assert {k: (m.mean, m.n) for k, m in summary.metrics.items()} == {
        "correctness": (0.5, 2), "performance": (0.75, 2), "reward": (0.5, 2)}  # fmt: skip
    assert summary.errors_by_kind == {"model_call": 1, "verifier": 1}
    assert (
        summary.per_task["builtin/multi"]["metrics_only"] == 2
        and summary.per_task["builtin/multi"]["errors"] == 0
    )
    assert summary.per_task["builtin/multi"]["metrics"] == {"correctness": 0.5, "performance": 0.75}
    text = _caption(summary)
    assert "correctness" in text and "performance" in text  # one column per metric
    assert "2 scored trial(s) report several metrics and no `reward`" in text and "give --reward-key" in text
    assert job.summary() == summary  # what result.json holds under harbor_rl
    # Harbor reads the folder and computes the same stats: its Mean over every key (a missing key is 0,
    # over the 4 reward-valid trials), no pass@k (more than one key), both errors as exceptions.
    report = validate_job(job.root)
    assert report["errors"] == [] and report["trials"] == 6
    evals = report["evals"]["mini-swe-agent__m__builtin"]
    assert (evals["n_trials"], evals["n_errors"], evals["pass_at_k"]) == (4, 2, {})
    assert evals["metrics"] == [pytest.approx({"correctness": 0.25, "performance": 0.375, "reward": 0.25})]
    assert sorted(evals["exception_stats"]) == ["ApiError", "RewardFileNotFoundError"]


def test_reward_key_chooses_the_reward_and_trials_without_it_are_not_errors(tmp_path):
    summary = write_job(tmp_path, reward_key="correctness").summarize(
        planned_trials=6, started_at=0, wall_time_s=1
    )
    assert summary.reward_key == "correctness"
    assert summary.outcomes == {"pass": 1, "fail": 1, "scored": 2, "error": 2}
    assert summary.scores.pass_at_k == {"1": 0.5, "2": 1.0} and summary.scores.metrics_only == 2
    assert summary.per_task["builtin/multi"]["rewards"] == [1.0, 0.0]
    assert "2 scored trial(s) report no 'correctness'" in _caption(summary)


def test_per_step_results_reach_the_trial_the_summary_and_harbors_step_results(tmp_path):
    steps = [
        StepResult(
            name="write", reward=1.0, rewards={"reward": 1.0}, timings={"agent": 1.0, "verifier": 0.5}
        ),
        StepResult(name="test", error=NO_REWARD_FILE, timings={"agent": 1.0, "verifier": 0.5}),
    ]
    config = EvalConfig(harness="oracle")
    job = Job.create_or_resume(tmp_path / "job", config, resume=False)
    facts = TaskFacts(name="demo/steps", path=str(tmp_path / "steps"), checksum="0" * 64)
    outcome = rollout(1, env_reward=1.0, rewards={"reward": 1.0}, steps=steps)
    job.write_trial(trial_result(Trial("builtin", "steps", 0), outcome, time.time(), config, facts))
    [trial] = job.trials()
    assert [s.name for s in trial.steps] == ["write", "test"] and trial.outcome == "pass"
    summary = job.summarize(planned_trials=1, started_at=0, wall_time_s=1)
    assert summary.steps["write"].model_dump() == {"trials": 1, "verified": 1, "errors": 0, "mean_reward": 1.0,
                                                   "metrics": {"reward": {"mean": 1.0, "se": None, "n": 1}}}  # fmt: skip
    assert (summary.steps["test"].verified, summary.steps["test"].errors) == (0, 1)
    assert "step write: 1/1 verified, reward 1.000" in _caption(
        summary
    ) and "step test: 0/1 verified" in _caption(summary)
    # Harbor's policy voids a trial's reward when one of its steps' verifiers failed; our stats say so too.
    report = validate_job(job.root)
    assert report["errors"] == []
    evals = report["evals"]["oracle__builtin"]
    assert (evals["n_trials"], evals["n_errors"], evals["exception_stats"]) == (
        0,
        1,
        {"RewardFileNotFoundError": [trial_dir_name(job)]},
    )


def trial_dir_name(job: Job) -> str:
    [path] = [p for p in job.root.iterdir() if p.is_dir()]
    return path.name


def test_collect_rows_carry_every_metric_and_the_chosen_reward():
    outcome = rollout(1, rewards={"correctness": 1.0, "performance": 0.5})
    plain = build_episode(
        "e-000000",
        "builtin",
        "multi",
        "Fix it.",
        outcome,
        CollectConfig(provider="scripted", datasets=["x"]),
        "m",
    )
    assert plain.reward is None and plain.verify_metrics == {"correctness": 1.0, "performance": 0.5}
    assert not should_keep(plain) and should_keep(plain, keep_losses=True)
    keyed = build_episode(
        "e-000000", "builtin", "multi", "Fix it.", outcome,
        CollectConfig(provider="scripted", datasets=["x"], reward_key="performance"), "m",
    )  # fmt: skip
    assert isinstance(keyed, Episode) and keyed.reward == 0.5 and should_keep(keyed, min_reward=0.5)
