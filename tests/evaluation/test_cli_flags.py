"""What a user sees from `harbor eval` and `harbor collect`: a typo is refused in one line naming the
valid choices before anything runs (no job folder left for a bare --resume to pick up); sampling flags
reach the rollout request and the engine; old flag spellings still work, with a note."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from capture_proxy.store import TraceStore
from evaluation.jobs import Job
from harbor_rl.cli import app

pytestmark = pytest.mark.timeout(600)


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--harness", "mini-swe"], "unknown harness 'mini-swe'; choose one of: nop, oracle, mini-swe-agent"),
        (["--harness", "oracle", "--sandbox", "dockr"], "unknown sandbox 'dockr'; choose one of: local, docker, e2b"),
        (["--harness", "oracle", "--dataset", "bultin"], "'builtin', 'env-tasks'"),
        (["--harness", "oracle", "--task", "no-such-task*"], "no task matches"),
    ],
)  # fmt: skip
def test_eval_refuses_a_typo_before_any_trial_or_job_folder(tmp_path, runs_dir, flags, words):
    jobs = tmp_path / "jobs"
    result = _run("eval", *flags, "-o", str(jobs))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and words in lines[0] and lines[0].startswith("harbor eval: "), result.output
    assert "--debug" in lines[1] and "Traceback" not in result.output
    assert not jobs.exists()  # nothing for a bare --resume to take for the latest job


def test_after_a_refused_typo_a_bare_resume_finds_no_job(tmp_path, runs_dir):
    jobs = tmp_path / "jobs"
    assert _run("eval", "--harness", "oracle", "--sandbox", "dockr", "-o", str(jobs)).exit_code == 1
    result = _run("eval", "--harness", "oracle", "-o", str(jobs), "--resume")
    assert result.exit_code == 1 and "no harbor eval job in" in result.output


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--harness", "mini-swe"], "unknown harness 'mini-swe'"),
        (["--sandbox", "dockr"], "unknown sandbox 'dockr'; choose one of: local, docker, e2b"),
        (["--dataset", "bultin"], "'builtin', 'env-tasks'"),
    ],
)
def test_collect_refuses_a_typo_before_anything_runs(tmp_path, runs_dir, flags, words):
    out = tmp_path / "sft"
    result = _run("collect", "--provider", "scripted", *flags, "-o", str(out))
    assert result.exit_code == 1 and words in result.output and "Traceback" not in result.output
    assert result.output.startswith("harbor collect: ")
    assert not out.exists()


def test_eval_sampling_flags_reach_the_rollout_request(tmp_path, runs_dir, store_url):
    jobs = tmp_path / "jobs"
    result = _run("eval", "--harness", "oracle", "--task", "fix-pagination", "-o", str(jobs), "--job-name", "s",
                  "--store", store_url, "--temperature", "0.3", "--max-tokens", "7")  # fmt: skip
    assert result.exit_code == 0, result.output
    job = Job.open(jobs / "s")
    sampling = job.config().sampling
    assert (sampling.temperature, sampling.max_tokens) == (0.3, 7)
    [trial] = job.trials()
    store = TraceStore(store_url)
    try:
        # The eval session applies exactly the fields given over the agent's own sampling.
        assert store.get_session(trial.rollout_id).sampling == {"temperature": 0.3, "max_tokens": 7}
    finally:
        store.close()
    # Without the flags the agent keeps its own sampling: nothing is set on the session.
    result = _run("eval", "--harness", "oracle", "--task", "fix-pagination", "-o", str(jobs), "--job-name", "n",
                  "--store", store_url)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert Job.open(jobs / "n").config().sampling is None


def test_collect_sampling_flags_reach_the_engine(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    result = _run("collect", "--provider", "scripted", "-n", "2", "-o", str(out), "--store", store_url,
                  "--temperature", "0.25", "--max-tokens", "5")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    store = TraceStore(store_url)
    try:
        for row in rows:
            turns = store.get_turns(row["artifacts"]["rollout_id"])
            assert turns
            for turn in turns:  # what was sent to the teacher
                assert turn.metadata.sampling["temperature"] == 0.25
                assert turn.metadata.sampling["max_tokens"] <= 5
    finally:
        store.close()
    assert json.loads((out / "metadata.json").read_text())["sampling"] == {
        "temperature": 0.25,
        "max_tokens": 5,
    }


def test_old_eval_flags_still_work_with_a_note(tmp_path, runs_dir, store_url):
    jobs = tmp_path / "jobs"
    result = _run("eval", "--harness", "oracle", "--jobs-dir", str(jobs), "--job-name", "old",
                  "--n-concurrent=1", "--task-glob", "fix-p*", "--agent-timeout", "300", "--step-limit", "0",
                  "--store", store_url)  # fmt: skip
    assert result.exit_code == 0, result.output
    for old, new in [("--jobs-dir", "--output-dir"), ("--n-concurrent", "--max-concurrent"),
                     ("--task-glob", "--task"), ("--agent-timeout", "--agent-timeout-sec"),
                     ("--step-limit", "--agent-step-limit")]:  # fmt: skip
        assert f"harbor eval: {old} is deprecated; use {new}" in result.output
    config = Job.open(jobs / "old").config()
    assert (config.n_concurrent, config.task_globs, config.agent_timeout_sec) == (1, ["fix-p*"], 300.0)
    help_text = _run("eval", "--help").output
    assert (
        "--max-concurrent" in help_text
        and "--jobs-dir" not in help_text
        and "--n-concurrent" not in help_text
    )


def test_old_collect_flags_still_work_with_a_note(tmp_path, runs_dir, store_url):
    out = tmp_path / "sft"
    result = _run("collect", "--provider", "scripted", "-n", "1", "--output", str(out), "--keep-losses",
                  "--n-concurrent", "1", "--task-glob", "echo-*", "--store", store_url)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--output is deprecated; use --output-dir" in result.output
    assert "--keep-losses is deprecated; use --keep-all" in result.output
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["keep_losses"] is True and metadata["tasks"] == [
        "env-tasks/echo-hello-world",
        "env-tasks/echo-hi",
    ]
