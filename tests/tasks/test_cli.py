"""`harbor tasks check` and `harbor tasks init` through the real typer app."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app
from tasks import load_dataset_spec, load_task

runner = CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1"})


def _run(*args: str):
    return runner.invoke(app, ["tasks", *args], terminal_width=250)


def test_check_builtin_lists_every_task():
    result = _run("check", "builtin")
    assert result.exit_code == 0, result.output
    for task_id in load_dataset_spec("builtin").ids:
        assert task_id in result.output


def test_check_folder_reports_broken_tasks_and_unknown_keys(make_task, tmp_path):
    make_task("good", files={"task.toml": "[environment]\ngpu_count = 2\n"})
    make_task("broken", files={"tests/test.sh": None})
    make_task("gpu", files={"task.toml": "[environment]\ngpus = 1\n"})
    make_task("table", files={"task.toml": '[agent.network]\nmode = "allowlist"\n'})
    result = _run("check", str(tmp_path / "tasks"), "--sandbox", "local")
    assert result.exit_code == 1
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert "tests/test.sh" in rows["broken"] and "missing" in rows["broken"]
    assert "environment.gpu_count" in rows["good"]
    assert "cannot run on local" in rows["gpu"] and "gpus = 1" in rows["gpu"]
    assert "agent.network" in rows["table"] and "not Harbor fields" in rows["table"]
    # One refused task never hides the others: every one has its row.
    assert set(rows) >= {"broken", "good", "gpu", "table"}


def test_check_rejects_unknown_run_agents():
    result = _run("check", "builtin", "--run", "oracle,magic")
    assert result.exit_code != 0 and "magic" in result.output


def test_init_then_check_with_oracle_and_nop_on_local(tmp_path):
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local backend's task paths need it")
    created = _run("init", "my-task", "--dir", str(tmp_path))
    assert created.exit_code == 0, created.output
    task = load_task(tmp_path / "my-task")
    assert task.name == "local/my-task" and "__TASK_NAME__" not in task.instruction
    checked = _run("check", str(tmp_path / "my-task"), "--run", "oracle,nop", "--sandbox", "local")
    assert checked.exit_code == 0, checked.output
    assert "my-task" in checked.output and "ok" in checked.output


@pytest.mark.parametrize("name", ["Bad Name", "../escape", "-x"])
def test_init_rejects_bad_names(tmp_path, name):
    result = _run("init", name, "--dir", str(tmp_path))
    assert result.exit_code != 0 and not any(tmp_path.iterdir())


def test_init_refuses_to_overwrite(tmp_path):
    (tmp_path / "taken").mkdir()
    result = _run("init", "taken", "--dir", str(tmp_path))
    assert result.exit_code != 0 and "already exists" in result.output
