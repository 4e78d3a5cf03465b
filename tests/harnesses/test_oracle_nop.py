"""oracle and nop on a built-in task in a real local (bubblewrap) sandbox, scored by the real verifier."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnesses import AgentRun, HarnessConfigError, get_harness
from tasks import verify

from .conftest import builtin_task, rollout_name


async def run_and_verify(harness_name: str, backend) -> tuple[float | None, object]:
    task = builtin_task()
    sandbox = await backend.start(task.sandbox_spec(rollout_name(harness_name)))
    try:
        outcome = await get_harness(harness_name).run(
            sandbox,
            AgentRun(
                instruction=task.instruction,
                base_url="http://127.0.0.1:1/v1",
                api_key="unused",
                model="unused",
                workdir=task.config.environment.workdir,
                timeout_s=60,
                solution_dir=task.paths.solution_dir,
            ),
        )
        result = await verify(sandbox, task)
    finally:
        await sandbox.stop()
    return result.reward, outcome


async def test_oracle_solves_the_task(local_backend) -> None:
    reward, outcome = await run_and_verify("oracle", local_backend)
    assert outcome.exit_code == 0 and outcome.error is None, outcome.log_tail
    assert outcome.tool_calls_by_name == {"solve.sh": 1} and outcome.tool_failures == 0
    assert reward == 1.0


async def test_nop_leaves_the_task_unsolved(local_backend) -> None:
    reward, outcome = await run_and_verify("nop", local_backend)
    assert outcome.exit_code == 0 and outcome.tool_calls_by_name == {}
    assert reward == 0.0


async def test_oracle_without_a_solution_says_so(local_backend) -> None:
    task = builtin_task()
    sandbox = await local_backend.start(task.sandbox_spec(rollout_name("oracle")))
    try:
        run = AgentRun(
            instruction="x", base_url="http://127.0.0.1:1/v1", api_key="k", model="m", solution_dir=None
        )
        with pytest.raises(HarnessConfigError, match="solution"):
            await get_harness("oracle").run(sandbox, run)
    finally:
        await sandbox.stop()


def test_solution_env_comes_from_the_run_or_the_task_folder(tmp_path: Path) -> None:
    from harnesses.oracle import solution_env

    task_dir = tmp_path / "task"
    shutil.copytree(builtin_task().paths.root, task_dir)
    with (task_dir / "task.toml").open("a") as toml:
        toml.write('\n[solution]\nenv = { GREETING = "hi" }\n')
    run = AgentRun(instruction="x", base_url="http://127.0.0.1:1/v1", api_key="k", model="m")
    assert solution_env(run, task_dir / "solution") == {"GREETING": "hi"}
    given = run.model_copy(update={"extra": {"solution_env": {"N": 1}}})
    assert solution_env(given, task_dir / "solution") == {"N": "1"}
    assert solution_env(run, tmp_path / "not-a-task" / "solution") == {}
