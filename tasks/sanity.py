"""Sanity runs: the oracle must solve a task and doing nothing must not.

`oracle` uploads `solution/` to `/solution` and runs `bash /solution/solve.sh` in the task's workdir;
`nop` does nothing. Either way the verifier then scores the sandbox exactly as it would score an agent.
A task is sound when the oracle scores 1.0 and nop 0.0. Used by `harbor tasks check --run` and by the
oracle/nop harnesses.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Literal

from pydantic import BaseModel

from sandboxes.base import ExecResult, Sandbox, SandboxBackend
from sandboxes.errors import SandboxError
from tasks.errors import TaskFormatError
from tasks.loader import Task
from tasks.verifier import VerifierResult, verify

SanityAgent = Literal["oracle", "nop"]
EXPECTED_REWARD: dict[str, float] = {"oracle": 1.0, "nop": 0.0}
SOLUTION_DIR = "/solution"


class SanityResult(BaseModel):
    task_id: str
    agent: SanityAgent
    backend: str
    expected: float
    reward: float | None
    passed: bool
    agent_run: ExecResult | None = None
    """The oracle's run (None for nop, or when the sandbox never started)."""
    verifier: VerifierResult | None = None
    error: str | None = None
    duration_s: float = 0.0


async def run_sanity_agent(sandbox: Sandbox, task: Task, agent: SanityAgent) -> ExecResult | None:
    """Do the agent's turn: run the oracle, or nothing."""
    await sandbox.exec(["mkdir", "-p", "/logs/agent", "/logs/verifier"], user="root", timeout_s=30.0)
    if agent == "nop":
        return None
    if not task.paths.has_solution:
        raise TaskFormatError(task.paths.solve_script, "missing: the oracle needs solution/solve.sh")
    await sandbox.upload_dir(task.paths.solution_dir, SOLUTION_DIR)
    run = await sandbox.exec(
        ["bash", f"{SOLUTION_DIR}/solve.sh"],
        timeout_s=task.config.agent.timeout_sec,
        cwd=task.config.environment.workdir,
        env=dict(task.config.solution.env),
    )
    # The oracle's files must not help or hinder the verifier.
    await sandbox.exec(["rm", "-rf", SOLUTION_DIR], user="root", timeout_s=30.0)
    return run


async def sanity_check(
    task: Task,
    backend: SandboxBackend,
    agent: SanityAgent,
    *,
    proxy_port: int | None = None,
    verifier_timeout_sec: float | None = None,
) -> SanityResult:
    """Start a sandbox for `task`, run `agent`, verify, stop; never raises for a failing task."""
    expected = EXPECTED_REWARD[agent]
    started = time.monotonic()
    name = f"sanity-{agent}-{task.id}-{uuid.uuid4().hex[:8]}"
    outcome = SanityResult(
        task_id=task.id, agent=agent, backend=backend.name, expected=expected, reward=None, passed=False
    )
    sandbox: Sandbox | None = None
    try:
        sandbox = await backend.start(task.sandbox_spec(name, proxy_port=proxy_port))
        outcome.agent_run = await run_sanity_agent(sandbox, task, agent)
        outcome.verifier = await verify(sandbox, task, timeout_sec=verifier_timeout_sec)
    except (SandboxError, TaskFormatError, OSError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        if sandbox is not None:
            await sandbox.stop()
    if outcome.verifier is not None:
        outcome.reward = outcome.verifier.reward
        outcome.error = outcome.error or outcome.verifier.error
    outcome.passed = outcome.reward is not None and math.isclose(outcome.reward, expected, abs_tol=1e-9)
    outcome.duration_s = time.monotonic() - started
    return outcome
