"""`harbor eval` on the real Docker engine: oracle scores 1.0 and nop 0.0 with complete result files
(a few tasks by --task in the docker step; every built-in task in the slow step)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evaluation.jobs import Job
from harbor_rl.cli import app
from tasks import load_dataset_spec
from tests.sandboxes.conftest import BASE_IMAGE, docker_client_or_skip

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]
GLOBS = ["--task", "fix-pagination", "--task", "wordcount-cli"]


@pytest.fixture(scope="module")
def docker_ready():
    client = docker_client_or_skip()
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"base image {BASE_IMAGE} missing: build it with docker/sandbox-base/build.sh")


def _eval_docker(tmp_path, store_url, harness: str, *extra: str) -> dict:
    jobs = tmp_path / "jobs"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--harness",
            harness,
            "--sandbox",
            "docker",
            "--output-dir",
            str(jobs),
            "--job-name",
            harness,
            "--max-concurrent",
            "2",
            "--store",
            store_url,
            *extra,
        ],  # fmt: skip
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    job = Job.open(jobs / harness)
    for trial in job.trials():
        assert trial.error is None and trial.outcome in ("pass", "fail"), trial
        assert (job.trial_dir(trial.split, trial.task_id, trial.attempt) / "result.json").is_file()
    return json.loads(job.result_path.read_text())["harbor_rl"]


@pytest.mark.parametrize(("harness", "expected"), [("oracle", 1.0), ("nop", 0.0)])
def test_sanity_harnesses_in_docker(docker_ready, tmp_path, runs_dir, store_url, harness, expected):
    summary = _eval_docker(tmp_path, store_url, harness, *GLOBS)
    assert summary["complete"] and summary["planned_trials"] == 2
    assert summary["scores"]["pass_rate"] == expected and summary["errors_by_kind"] == {}


@pytest.mark.slow
def test_oracle_on_every_builtin_task_in_docker(docker_ready, tmp_path, runs_dir, store_url):
    summary = _eval_docker(tmp_path, store_url, "oracle")
    assert summary["complete"] and summary["planned_trials"] == len(load_dataset_spec("builtin").ids)
    assert summary["scores"]["pass_rate"] == 1.0 and summary["errors_by_kind"] == {}
