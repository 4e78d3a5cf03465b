"""`oracle`: run the task's own `solution/solve.sh`, to check a task is solvable and its verifier works.

Same steps as `tasks.sanity.run_sanity_agent` (which works from a loaded Task), from an AgentRun:
upload `solution/` to /solution, run `bash /solution/solve.sh` in the workdir, then remove /solution so
the oracle's files neither help nor hinder the verifier. The task's `[solution] env` is passed to the
script (`run.extra["solution_env"]`, or read from the task folder that holds `solution/`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harnesses._common import LOG_DIR, tail, timeout_grace, timeout_prefix
from harnesses.base import AgentOutcome, AgentRun
from harnesses.errors import HarnessConfigError
from tasks import TaskError, load_task

if TYPE_CHECKING:
    from sandboxes.base import ExecResult, ImageLayer, Sandbox

SOLUTION_DIR = "/solution"


class OracleHarness:
    name = "oracle"

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        solution_dir = require_solution(run.solution_dir)
        env = solution_env(run, solution_dir)
        result = await run_solution(
            sandbox, solution_dir, workdir=run.workdir, timeout_s=run.timeout_s, env=env
        )
        return AgentOutcome(
            exit_code=result.exit_code,
            timed_out=result.timed_out or result.exit_code == 124,
            tool_calls_by_name={"solve.sh": 1},
            tool_failures_by_name={} if result.ok else {"solve.sh": 1},
            log_tail=tail(result.stdout + result.stderr),
        )


def solution_env(run: AgentRun, solution_dir: Path) -> dict[str, str]:
    """The task's `[solution] env`: from `run.extra["solution_env"]`, else from the task's own task.toml."""
    given = run.extra.get("solution_env")
    if given is None:
        try:
            given = load_task(solution_dir.parent).config.solution.env
        except TaskError:
            given = {}  # not a task folder we can read: run solve.sh with the sandbox's environment
    return {str(k): str(v) for k, v in dict(given).items()}


def require_solution(solution_dir: Path | None) -> Path:
    """The task's solution folder, or a HarnessConfigError saying why the oracle cannot run."""
    if solution_dir is None:
        raise HarnessConfigError(
            "the oracle harness needs the task's solution/ folder (AgentRun.solution_dir)"
        )
    if not (solution_dir / "solve.sh").is_file():
        raise HarnessConfigError(f"{solution_dir}: no solve.sh, so the oracle cannot run this task")
    return solution_dir


async def run_solution(
    sandbox: Sandbox, solution_dir: Path, *, workdir: str, timeout_s: float, env: dict[str, str] | None = None
) -> ExecResult:
    """Upload `solution_dir` to /solution, run solve.sh in `workdir` (output also in /logs/agent/oracle.txt)."""
    await sandbox.exec(["mkdir", "-p", LOG_DIR], user="root", timeout_s=30.0)
    await sandbox.upload_dir(solution_dir, SOLUTION_DIR)
    command = (
        f"{timeout_prefix(timeout_s)} bash {SOLUTION_DIR}/solve.sh 2>&1 | tee {LOG_DIR}/oracle.txt; "
        "exit ${PIPESTATUS[0]}"
    )
    result = await sandbox.exec(command, cwd=workdir, env=env or None, timeout_s=timeout_grace(timeout_s))
    await sandbox.exec(["rm", "-rf", SOLUTION_DIR], user="root", timeout_s=30.0)
    return result
