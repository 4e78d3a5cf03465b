"""`oracle`: run the task's own `solution/solve.sh`, to check a task is solvable and its verifier works.

The same run as `harbor tasks check --run oracle` (`tasks.sanity.run_solution`), as Harbor's oracle agent
does it (`harbor/agents/oracle.py`): solution/ uploaded to /solution, solve.sh run by its shebang in the
workdir as the sandbox's default user (the server's sandbox defaults to `[agent] user`), with
DEBIAN_FRONTEND=noninteractive and the task's `[solution] env` (`AgentRun.solution_env`, resolved by the
server), under the agent timeout, its output in /logs/agent/oracle.txt. A non-zero exit does not fail the
run: the verifier still grades it, and the outcome reports the exit code. Skills and MCP servers are
ignored, as in Harbor (`harbor/trial/trial.py:1789-1810`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harnesses._common import tail
from harnesses.base import AgentOutcome, AgentRun
from harnesses.errors import HarnessConfigError
from tasks.sanity import run_solution

if TYPE_CHECKING:
    from sandboxes.base import ImageLayer, Sandbox


class OracleHarness:
    name = "oracle"

    def image_layer(self) -> ImageLayer | None:
        return None

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        solution_dir = require_solution(run.solution_dir)
        result = await run_solution(
            sandbox, solution_dir, workdir=run.workdir, timeout_s=run.timeout_s, env=run.solution_env
        )
        return AgentOutcome(
            exit_code=result.exit_code,
            timed_out=result.timed_out or result.exit_code == 124,
            tool_calls_by_name={"solve.sh": 1},
            tool_failures_by_name={} if result.ok else {"solve.sh": 1},
            log_tail=tail(f"{result.stdout}{result.stderr}\n[solve.sh exit code: {result.exit_code}]"),
        )


def require_solution(solution_dir: Path | None) -> Path:
    """The task's solution folder, or a HarnessConfigError saying why the oracle cannot run."""
    if solution_dir is None:
        raise HarnessConfigError(
            "the oracle harness needs the task's solution/ folder (AgentRun.solution_dir)"
        )
    if not (solution_dir / "solve.sh").is_file():
        raise HarnessConfigError(f"{solution_dir}: no solve.sh, so the oracle cannot run this task")
    return solution_dir
