"""oracle and nop on a built-in task in a real local (bubblewrap) sandbox, scored by the real verifier."""

from __future__ import annotations

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


SOLVE_IN_PYTHON = """#!/usr/bin/env python3
import os
import sys

for name in ("GREETING", "DEBIAN_FRONTEND"):
    print(name, os.environ.get(name))
print("uid", os.getuid())
print("cwd", os.getcwd())
sys.exit(3)
"""


def solution_in_python(tmp_path: Path) -> Path:
    """A solution/ whose solve.sh is a Python script, not executable: only its shebang can run it (bash
    would fail on it), and only the oracle's chmod makes it executable."""
    solution = tmp_path / "solution"
    solution.mkdir()
    (solution / "solve.sh").write_text(SOLVE_IN_PYTHON)
    (solution / "solve.sh").chmod(0o644)
    return solution


@pytest.mark.parametrize("user", [None, "nobody"])
async def test_the_oracle_runs_solve_sh_as_harbor_does(local_backend, tmp_path: Path, user) -> None:
    from sandboxes import with_default_user

    task = builtin_task()
    sandbox = await local_backend.start(task.sandbox_spec(rollout_name("oracle")))
    try:
        run = AgentRun(
            instruction="x",
            base_url="http://127.0.0.1:1/v1",
            api_key="k",
            model="m",
            workdir=task.config.environment.workdir,
            timeout_s=60,
            solution_dir=solution_in_python(tmp_path),
            solution_env={"GREETING": "hi"},
            user=user,
            skills_dir="/nowhere",  # ignored by the oracle, as in Harbor
            mcp_servers=[{"name": "ignored", "transport": "stdio", "command": "false"}],
        )
        outcome = await get_harness("oracle").run(with_default_user(sandbox, user), run)
        log = (await sandbox.download_file("/logs/agent/oracle.txt")).decode()
    finally:
        await sandbox.stop()
    # a failing solve.sh is the solution's outcome (graded as usual), not a harness error
    assert outcome.exit_code == 3 and outcome.error is None and not outcome.timed_out
    assert outcome.tool_failures_by_name == {"solve.sh": 1}
    assert "[solve.sh exit code: 3]" in outcome.log_tail
    lines = log.splitlines()
    assert lines[:2] == ["GREETING hi", "DEBIAN_FRONTEND noninteractive"]
    assert lines[2] == ("uid 65534" if user == "nobody" else "uid 0")
    assert lines[3] == f"cwd {task.config.environment.workdir}"
    assert "GREETING hi" in outcome.log_tail  # the log's tail is the outcome's
