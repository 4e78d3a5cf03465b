"""Real runs of tasks whose verifier writes several metrics and no `reward` key: a local task of ours
(a built-in task whose test.sh writes `{"correctness", "performance"}`, and whose solution publishes an
artifact) on the local sandbox, and the Harbor cookbook's multi-reward recipe on Docker; Harbor's package
reads both job folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluation.jobs import Job
from harbor_rl.cli import app
from tasks import BUILTIN_DIR
from tests.harbor_ref import harbor_python, validate_job

pytestmark = pytest.mark.timeout(900)
RECIPE = Path(__file__).parents[1] / "fixtures" / "harbor_tasks" / "harbor-cookbook" / "multi-reward"
"""harbor-framework/harbor-cookbook@e093c9a860b988d9d74901010ddddb9c7f124f92, copied verbatim (Apache-2.0)."""
TWO_KEY_TEST = """#!/bin/bash
# The built-in task's tests, scored on two metrics and no `reward` key, as the cookbook's recipe does.
mkdir -p /logs/verifier
cd /app
export PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
correctness=0
python3 -m pytest -q -p no:cacheprovider /tests/test_pagination.py && correctness=1
echo "{\\"correctness\\": $correctness, \\"performance\\": 0.5}" > /logs/verifier/reward.json
"""


def _two_key_dataset(root: Path) -> Path:
    task = root / "tasks" / "two-keys"
    shutil.copytree(BUILTIN_DIR / "fix-pagination", task)
    (task / "tests" / "test.sh").write_text(TWO_KEY_TEST)
    solve = task / "solution" / "solve.sh"  # and it publishes an artifact, which the trial folder keeps
    solve.write_text(
        solve.read_text() + "mkdir -p /logs/artifacts && echo solved > /logs/artifacts/notes.txt\n"
    )
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace('name = "harbor-rl/fix-pagination"', 'name = "harbor-rl/two-keys"')
    )
    return task.parent


def _eval(*args: str) -> None:
    result = CliRunner().invoke(app, ["eval", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_two_metric_task_is_scored_on_both_and_never_an_error(tmp_path, runs_dir, store_url):
    harbor_python()
    dataset = _two_key_dataset(tmp_path)
    jobs = tmp_path / "jobs"
    output = _eval("--dataset", str(dataset), "--harness", "oracle", "-k", "2", "-o", str(jobs),
                   "--job-name", "plain", "--store", store_url)  # fmt: skip
    summary = Job.open(jobs / "plain").summary()
    assert summary.outcomes == {"scored": 2} and summary.errors_by_kind == {}
    assert {k: m.mean for k, m in summary.metrics.items()} == {"correctness": 1.0, "performance": 0.5}
    assert summary.scores.pass_at_k == {} and "give --reward-key" in " ".join(output.split())
    job = Job.open(jobs / "plain")
    for trial in job.trials():
        folder = job.trial_dir(trial.split, trial.task_id, trial.attempt)
        assert (folder / "artifacts" / "logs" / "artifacts" / "notes.txt").read_text() == "solved\n"
        reward = json.loads((folder / "verifier" / "reward.json").read_text())
        assert reward == {"correctness": 1.0, "performance": 0.5}
    report = validate_job(jobs / "plain")
    assert report["errors"] == [] and report["manifests"] == 2
    [evals] = report["evals"].values()
    assert evals["metrics"] == [{"correctness": 1.0, "performance": 0.5}] and evals["n_trials"] == 2
    _eval("--dataset", str(dataset), "--harness", "oracle", "-k", "2", "-o", str(jobs), "--job-name", "keyed",
          "--reward-key", "correctness", "--store", store_url)  # fmt: skip
    keyed = Job.open(jobs / "keyed").summary()
    assert keyed.scores.pass_at_k == {"1": 1.0, "2": 1.0} and keyed.outcomes == {"pass": 2}


@pytest.mark.docker
@pytest.mark.skipif(not RECIPE.is_dir(), reason=f"the cookbook fixture is not here ({RECIPE})")
def test_cookbook_multi_reward_recipe_reports_correctness_and_performance(tmp_path, runs_dir, store_url):
    """The recipe's verifier writes {correctness, performance} and no `reward`; its oracle passes both.
    Needs the recipe's image (ubuntu:24.04, or its stand-in) and the network its verifier uses (apt, uv)."""
    harbor_python()
    from tests.sandboxes.conftest import docker_client_or_skip

    docker_client_or_skip()
    dataset = tmp_path / "tasks"
    shutil.copytree(RECIPE, dataset / "multi-reward")
    jobs = tmp_path / "jobs"
    _eval("--dataset", str(dataset), "--harness", "oracle", "--sandbox", "docker", "-o", str(jobs),
          "--job-name", "cookbook", "--reward-key", "correctness", "--store", store_url)  # fmt: skip
    job = Job.open(jobs / "cookbook")
    summary = job.summary()
    assert summary.errors_by_kind == {}, summary.errors_by_message
    assert {k: m.mean for k, m in summary.metrics.items()} == {"correctness": 1.0, "performance": 1.0}
    assert summary.scores.pass_rate == 1.0
    [trial] = job.trials()
    folder = job.trial_dir(trial.split, trial.task_id, trial.attempt)
    assert json.loads((folder / "verifier" / "reward.json").read_text()) == {
        "correctness": 1.0,
        "performance": 1.0,
    }
    report = validate_job(job.root)
    assert report["errors"] == []
    [evals] = report["evals"].values()
    assert evals["metrics"] == [{"correctness": 1.0, "performance": 1.0}]
