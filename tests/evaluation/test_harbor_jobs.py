"""Harbor's tools read what `harbor eval` writes: real runs (the oracle on the local sandbox; a model
through the capture proxy) leave a jobs folder in Harbor's layout that Harbor 0.26.0's own models, its
viewer's scanner and its ATIF validator load without an error, with the job stats Harbor itself computes
from the trials, and the trajectories carry the engine's token ids exactly as the store captured them."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from evaluation.jobs import Job
from evaluation.models import EvalConfig
from evaluation.rollouts import RolloutOutcome
from evaluation.runner import TaskFacts, Trial, run_eval, trial_result
from evaluation.trial_folder import write_trial_outputs
from harbor_rl.cli import app
from harbor_server.models import RolloutResult
from tests.harbor_ref import harbor_python, validate_job

pytestmark = pytest.mark.timeout(600)
MULTI_STEP = Path(__file__).parents[1] / "fixtures" / "harbor_tasks" / "harbor-cookbook" / "multi-step"
"""harbor-framework/harbor-cookbook@e093c9a860b988d9d74901010ddddb9c7f124f92, copied verbatim (Apache-2.0)."""
TRIAL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,32}__[2-9A-HJ-NP-Za-km-z]{7}$")
"""`<task[:32]>__<7 ShortUUID characters>`, as Harbor names trial folders."""


@pytest.fixture(autouse=True)
def _harbor():
    harbor_python()  # skips, naming the set-up step, where Harbor's venv is missing


def _trial_dirs(job: Job) -> list:
    return sorted(p for p in job.root.iterdir() if p.is_dir())


def test_an_oracle_job_folder_is_harbors(tmp_path, runs_dir, store_url):
    args = ["eval", "--harness", "oracle", "--task", "fix-p*", "--task", "lru-cache", "-k", "2",
            "-o", str(tmp_path / "jobs"), "--job-name", "o", "--store", store_url]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    job = Job.open(tmp_path / "jobs" / "o")
    dirs = _trial_dirs(job)
    assert len(dirs) == 4 and all(TRIAL_NAME.match(d.name) for d in dirs), dirs
    for trial in job.trials():
        folder = job.trial_dir(trial.split, trial.task_id, trial.attempt)
        # What test.sh left in /logs/verifier (the built-in tasks write reward.txt), kept as Harbor keeps it.
        assert (folder / "verifier" / "reward.txt").read_text().strip() == "1"
        assert (folder / "verifier" / "test-stdout.txt").read_text().strip()  # the verifier's output
        assert not (folder / "agent" / "trajectory.json").exists()  # the oracle calls no model
    report = validate_job(job.root)
    assert report["errors"] == [] and report["trials"] == 4
    assert report["evals"]["oracle__builtin"] | {"reward_stats": None} == {
        "n_trials": 4, "n_errors": 0, "metrics": [{"mean": 1.0}], "pass_at_k": {"2": 1.0},
        "reward_stats": None, "exception_stats": {}}  # fmt: skip
    # A resumed run finds every trial where it left it: nothing runs, no folder is added or renamed.
    again = CliRunner().invoke(app, [*args, "--resume"], catch_exceptions=False)
    assert again.exit_code == 0 and "4 already finished" in again.output.replace("\n", " ")
    assert _trial_dirs(job) == dirs
    # The judge is awake: a result.json whose stats or trial fields are off is reported.
    broken = tmp_path / "jobs" / "broken"
    shutil.copytree(job.root, broken)
    doc = json.loads((broken / "result.json").read_text())
    doc["stats"]["evals"]["oracle__builtin"]["n_trials"] = 3
    (broken / "result.json").write_text(json.dumps(doc))
    trial_doc = json.loads((broken / dirs[0].name / "result.json").read_text())
    del trial_doc["task_checksum"]
    (broken / dirs[0].name / "result.json").write_text(json.dumps(trial_doc))
    errors = validate_job(broken)["errors"]
    assert any("task_checksum" in e for e in errors) and any(
        e.startswith("result.json stats.evals") for e in errors
    )


async def test_a_model_job_has_atif_trajectories_with_the_captured_token_ids(tmp_path, runs_dir, store_url):
    settings = ImitationSettings(model="imitation-model", completion_tokens=400)
    with serve_in_thread(create_imitation_app(settings)) as url:
        config = EvalConfig(datasets=["env-tasks"], harness="env-factory", llm_url=url + "/v1",
                            model="imitation-model", task_globs=["echo-hello-world", "wordle-crane"])  # fmt: skip
        summary = await run_eval(config, jobs_dir=tmp_path / "jobs", job_name="m", store_url=store_url)
    assert summary.scores.errors == 0 and summary.model_calls >= 2
    job = Job.open(tmp_path / "jobs" / "m")
    report = validate_job(job.root)
    assert report["errors"] == [] and report["trajectories"] == 2
    # Every model call is an agent step with its token ids and logprobs; its tool calls were answered.
    assert report["agent_steps"] == summary.model_calls == report["steps_with_token_ids"]
    assert report["steps_with_tool_calls"] > 0 and report["observations"] > 0
    assert "env-factory__imitation-model__env-tasks" in report["evals"]
    store = TraceStore(store_url)
    try:
        for trial in job.trials():
            folder = job.trial_dir(trial.split, trial.task_id, trial.attempt)
            trajectory = json.loads((folder / "agent" / "trajectory.json").read_text())
            agent = [s for s in trajectory["steps"] if s["source"] == "agent"]
            turns = store.get_turns(trial.rollout_id)
            assert [s["metrics"]["completion_token_ids"] for s in agent] == [
                t.completion_token_ids for t in turns
            ]
            assert [s["metrics"]["logprobs"] for s in agent] == [t.per_token_logps for t in turns]
            assert trajectory["session_id"] == trial.rollout_id
    finally:
        store.close()


@pytest.mark.docker
@pytest.mark.skipif(not MULTI_STEP.is_dir(), reason=f"the cookbook fixture is not here ({MULTI_STEP})")
def test_a_multi_step_job_folder_is_harbors(tmp_path, runs_dir, store_url):
    """The cookbook's three-step recipe: each step's verifier output, metrics and artifacts where Harbor
    keeps them (steps/<step>/), its step_results in result.json, and per-step means in the summary."""
    from tests.sandboxes.conftest import docker_client_or_skip

    docker_client_or_skip()
    shutil.copytree(MULTI_STEP, tmp_path / "tasks" / "multi-step")
    args = ["eval", "--dataset", str(tmp_path / "tasks"), "--harness", "oracle", "--sandbox", "docker",
            "-o", str(tmp_path / "jobs"), "--job-name", "s", "--store", store_url]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    job = Job.open(tmp_path / "jobs" / "s")
    steps = ["scaffold", "implement", "document"]
    summary = job.summary()
    assert summary.scores.pass_rate == 1.0 and list(summary.steps) == steps
    assert all(
        (s.verified, s.errors, s.metrics["reward"].mean) == (1, 0, 1.0) for s in summary.steps.values()
    )
    [trial] = job.trials()
    folder = job.trial_dir(trial.split, trial.task_id, trial.attempt)
    for step in steps:
        assert (folder / "steps" / step / "verifier" / "reward.txt").read_text().strip() == "1"
        assert (folder / "steps" / step / "artifacts" / "manifest.json").is_file()
    doc = json.loads((folder / "result.json").read_text())
    assert [s["step_name"] for s in doc["step_results"]] == steps
    report = validate_job(job.root)
    assert report["errors"] == [] and report["manifests"] == 3


def test_artifacts_keep_harbors_manifest(tmp_path):
    """Artifacts the server collected elsewhere (here a folder written by hand, as Harbor's artifact handler
    lays it out) land in the trial's artifacts/ and steps/<step>/artifacts/, and Harbor reads the manifest."""
    collected = tmp_path / "collected"
    (collected / "artifacts" / "logs" / "artifacts").mkdir(parents=True)
    (collected / "artifacts" / "logs" / "artifacts" / "notes.txt").write_text("kept\n")
    (collected / "steps" / "build" / "artifacts").mkdir(parents=True)
    (collected / "steps" / "build" / "artifacts" / "out.log").write_text("built\n")
    manifest = [{"source": "/logs/artifacts", "destination": "artifacts/logs/artifacts", "type": "directory",
                 "status": "ok", "service": None, "exclude": []}]  # fmt: skip
    (collected / "artifacts" / "manifest.json").write_text(json.dumps(manifest))
    config = EvalConfig(harness="oracle")
    job = Job.create_or_resume(tmp_path / "job", config, resume=False)
    facts = TaskFacts(name="demo/a", path=str(tmp_path / "a"), checksum="0" * 64)
    folder = job.begin_trial("builtin", "a", 0, facts.path)
    result = RolloutResult(rollout_id="r1", status="completed", env_reward=1.0, rewards={"reward": 1.0},
                           artifacts_dir=str(collected), agent_log_tail="solved\n")  # fmt: skip
    outcome = RolloutOutcome(result=result, turns=[])
    write_trial_outputs(folder, outcome, harness="oracle", model=None)
    job.write_trial(trial_result(Trial("builtin", "a", 0), outcome, time.time(), config, facts))
    assert (folder / "artifacts" / "logs" / "artifacts" / "notes.txt").read_text() == "kept\n"
    assert (folder / "steps" / "build" / "artifacts" / "out.log").read_text() == "built\n"
    assert (folder / "agent" / "oracle.txt").read_text() == "solved\n"
    job.summarize(planned_trials=1, started_at=time.time(), wall_time_s=1.0)
    report = validate_job(job.root)
    assert report["errors"] == [] and report["manifests"] == 1
