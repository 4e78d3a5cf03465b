"""The new dataset forms through the commands users type, offline: `harbor eval --dataset NAME@VERSION
--registry-path FILE` and `--dataset hf:REPO` (task-folder layout) run the oracle on the real `local`
sandbox; `harbor serve --dataset NAME@VERSION` lists the registry's tasks; `harbor tasks check` reads a
pre-filled Hub cache through HF_HOME and HF_HUB_OFFLINE=1 in a fresh process; a bad name is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import huggingface_hub.constants
import pytest
from typer.testing import CliRunner

from evaluation.jobs import Job
from harbor_rl.cli import REGISTRY_FLAGS, app
from harbor_server.embedded import running_server
from tasks import BUILTIN_DIR
from tasks.registry import REGISTRY_PATH_ENV, REGISTRY_URL_ENV
from tests.server.conftest import make_config
from tests.tasks.dataset_sources import builtin_tasks_repo, prefill_hub_cache, registry_entry, write_registry

pytestmark = pytest.mark.timeout(600)
TASKS = ["fix-pagination", "parse-dotenv"]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Cache, runs folder and registry variables of this test only (the CLI sets the latter)."""
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local sandbox needs it")
    monkeypatch.setenv("HARBOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    for name in (REGISTRY_PATH_ENV, REGISTRY_URL_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def registry(isolated):
    url, commit = builtin_tasks_repo(isolated / "repo", TASKS)
    tasks = [{"name": n, "git_url": url, "git_commit_id": commit, "path": f"tasks/{n}"} for n in TASKS]
    return write_registry(isolated / "registry.json", [registry_entry("demo", "1.0", tasks)])


def _oracle_eval(tmp_path, dataset: str, *extra: str) -> Job:
    args = ["eval", "--dataset", dataset, "--harness", "oracle", "-o", str(tmp_path / "jobs"),
            "--job-name", "j", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return Job.open(tmp_path / "jobs" / "j")


def test_eval_registry_dataset_with_registry_path(isolated, registry):
    job = _oracle_eval(isolated, "demo@1.0", "--registry-path", str(registry))
    trials = job.trials()
    assert sorted(t.task_id for t in trials) == TASKS
    assert all(t.reward == 1.0 and t.error is None for t in trials), trials
    summary = json.loads(job.result_path.read_text())["harbor_rl"]
    assert summary["complete"] and summary["scores"]["pass_rate"] == 1.0


def test_eval_hub_repo_of_task_folders_offline(isolated, monkeypatch):
    source = isolated / "src"
    for name in TASKS:
        shutil.copytree(BUILTIN_DIR / name, source / "tasks" / name)
    hub = isolated / "hf-home" / "hub"
    prefill_hub_cache(hub, "org/harbor-tasks", source)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    trials = _oracle_eval(isolated, "hf:org/harbor-tasks").trials()
    assert sorted(t.task_id for t in trials) == TASKS
    assert all(t.reward == 1.0 and t.error is None for t in trials), trials


def test_serve_lists_a_registry_dataset(isolated, registry, monkeypatch):
    monkeypatch.setenv(REGISTRY_PATH_ENV, str(registry))
    config = make_config(isolated, datasets=["demo@1.0", "builtin"])
    with running_server(config) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        info = client.get("/info").json()
        assert {d["split"]: d["num_tasks"] for d in info["datasets"]} == {"demo@1.0": 2, "builtin": 13}
        page = client.get("/tasks", params={"split": "demo@1.0"}).json()
        assert [t["task_id"] for t in page["tasks"]] == TASKS
        assert client.get("/tasks/demo@1.0/parse-dotenv").status_code == 200


def test_tasks_check_reads_the_hub_cache_of_hf_home_offline(isolated):
    source = isolated / "src"
    shutil.copytree(BUILTIN_DIR / "sqlite-query", source / "tasks" / "sqlite-query")
    prefill_hub_cache(isolated / "hf-home" / "hub", "org/one-task", source)
    env = {**os.environ, "HF_HOME": str(isolated / "hf-home"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", "from harbor_rl.cli import app; app()", "tasks", "check", "hf:org/one-task"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sqlite-query" in done.stdout and "Traceback" not in done.stderr


def test_unknown_registry_dataset_is_one_line_with_what_exists(isolated, registry):
    args = ["eval", "--registry-path", str(registry), "--dataset", "dmeo@1.0", "--harness", "oracle",
            "-o", str(isolated / "jobs")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "has no dataset 'dmeo'; did you mean demo?" in result.output
    assert "Traceback" not in result.output and not (isolated / "jobs").exists()


def test_registry_flags_set_the_variables_tasks_registry_reads():
    assert REGISTRY_FLAGS == {"--registry-path": REGISTRY_PATH_ENV, "--registry-url": REGISTRY_URL_ENV}
