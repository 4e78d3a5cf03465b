"""A task's skills (`[environment] skills_dir`, a folder inside the sandbox), copied into the agent's own
skills folder before it starts, as each of Harbor's installed agents does at the start of its run:
`cp -r <skills_dir>/* <agent's skills folder>/ 2>/dev/null || true`, as the agent's user (for example
`harbor/agents/installed/claude_code.py:1873-1885`). A skills_dir that is not a folder copies nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from harnesses.base import AgentRun
from harnesses.errors import HarnessConfigError

if TYPE_CHECKING:
    from sandboxes.base import Sandbox

log = logging.getLogger(__name__)

_MISSING = "harbor-rl: no skills folder"
_COPY = (
    f'if [ -d "$1" ]; then mkdir -p "$2" && cp -r "$1"/* "$2"/ 2>/dev/null; else echo "{_MISSING}"; fi; true'
)
_warned: set[str] = set()


async def copy_skills(sandbox: Sandbox, run: AgentRun, destination: str) -> None:
    """Copy the contents of `run.skills_dir` into `destination`, as the sandbox's default (the agent's)
    user; a skills_dir that is not a folder is logged once per folder and copies nothing."""
    if not run.skills_dir:
        return
    result = await sandbox.exec(["sh", "-c", _COPY, "sh", run.skills_dir, destination], timeout_s=120.0)
    if _MISSING in result.stdout and run.skills_dir not in _warned:
        _warned.add(run.skills_dir)
        log.warning("skills_dir %s is not a folder in the sandbox; no skills were copied", run.skills_dir)


def refuse_skills(agent: str, run: AgentRun) -> None:
    """For an agent without skills: a task with a skills_dir is refused, as Harbor fails the trial
    (`harbor/trial/trial.py:1789-1800`)."""
    if run.skills_dir:
        raise HarnessConfigError(
            f"{agent} does not support skills (the task sets [environment] skills_dir); "
            "use claude-code, opencode, codex or qwen-code"
        )
