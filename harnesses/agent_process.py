"""One agent process in a sandbox, the way the npm agents run: the instruction on stdin, the event log
it prints on stdout kept in /logs/agent, its own `timeout`, and the outcome built from what it did."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnesses._common import LOG_DIR, tail, timeout_grace
from harnesses.base import AgentOutcome, AgentRun
from harnesses.skills import copy_skills
from harnesses.tool_metrics import ToolMetrics
from sandboxes.errors import SandboxError

if TYPE_CHECKING:
    from sandboxes.base import ExecResult, Sandbox


@dataclass(frozen=True)
class AgentFiles:
    """Where one agent's files live in the sandbox."""

    events_log: str
    """Its stdout: the event log the harness reads."""
    stderr_log: str
    instruction: str
    """The instruction, written here and fed to it on stdin."""
    state_dir: str
    """Its own config and state folder (created before it starts)."""


@dataclass(frozen=True)
class AgentProcess:
    """A finished agent process: its exit, and its event log (None when it wrote none)."""

    agent: str
    result: ExecResult
    timed_out: bool
    events: str | None
    missing_reason: str = ""

    def outcome(
        self, metrics: ToolMetrics, error: str | None, text: str, *, stopped_at_limit: bool = False
    ) -> AgentOutcome:
        """The outcome; a non-zero exit without an error of its own is one, unless it timed out or
        stopped at a limit it exits non-zero for."""
        code = self.result.exit_code
        if error is None and code not in (0, None) and not (self.timed_out or stopped_at_limit):
            error = f"{self.agent} exited with code {code}"
        return AgentOutcome(
            exit_code=code,
            timed_out=self.timed_out,
            error=error,
            tool_calls_by_name=metrics.calls_by_name,
            tool_failures_by_name=metrics.failures_by_name,
            log_tail=tail(f"{self.result.stderr}\n{text}"),
        )

    def without_log(self) -> AgentOutcome:
        """The outcome when the agent wrote no event log (a harness error unless it timed out)."""
        error = None
        if not self.timed_out:
            error = (
                f"{self.agent} wrote no event log ({self.missing_reason}); exit code {self.result.exit_code}"
            )
        return AgentOutcome(
            exit_code=self.result.exit_code,
            timed_out=self.timed_out,
            error=error,
            log_tail=tail(self.result.stdout + self.result.stderr),
        )


async def run_agent(
    sandbox: Sandbox,
    run: AgentRun,
    agent: str,
    argv: list[str],
    env: dict[str, str],
    files: AgentFiles,
    extra_files: dict[str, bytes] | None = None,
    *,
    skills_folder: str | None = None,
) -> AgentProcess:
    """Write the instruction (and `extra_files`, e.g. a config) into the agent's state folder, copy the
    task's skills into `skills_folder`, run `argv` under coreutils `timeout` (TERM at the limit, KILL 10 s
    later, exit 124) as the sandbox's default user, and read back the event log it printed."""
    await write_state(
        sandbox, files.state_dir, {**(extra_files or {}), files.instruction: run.instruction.encode()}
    )
    if skills_folder is not None:
        await copy_skills(sandbox, run, skills_folder)
    script = (
        f'mkdir -p {LOG_DIR} && "$@" > {files.events_log} 2> {files.stderr_log} < {files.instruction}; '
        f"code=$?; tail -c 8000 {files.stderr_log} >&2; exit $code"
    )
    limit = ["timeout", "--kill-after=10", str(max(1, int(run.timeout_s)))]
    result = await sandbox.exec(
        ["bash", "-c", script, "bash", *limit, *argv],
        cwd=run.workdir,
        env=env,
        timeout_s=timeout_grace(run.timeout_s),
    )
    timed_out = result.timed_out or result.exit_code == 124
    try:
        events = (await sandbox.download_file(files.events_log)).decode("utf-8", errors="replace")
    except Exception as exc:  # noqa: BLE001 - any backend's "file not found" means the same here
        return AgentProcess(agent, result, timed_out, None, f"{type(exc).__name__}: {exc}")
    return AgentProcess(agent, result, timed_out, events)


async def write_state(sandbox: Sandbox, state_dir: str, files: dict[str, bytes]) -> None:
    """Upload `files` (configs holding the session key, the instruction) into `state_dir`, and make the
    folder the agent's and the files private to it: uploads land as root, and an agent that runs as the
    task's `[agent] user` must read its config and write its state there. Harbor does the same: a state
    folder made by root and given to the agent's uid (`harbor/agents/installed/codex.py:735-756`), each
    config chowned to the agent and chmod 600 (`harbor/agents/installed/base.py:1118-1140`)."""
    owner = await agent_owner(sandbox)
    for path, data in files.items():
        await sandbox.upload_file(data, path)
    paths = " ".join(shlex.quote(path) for path in files)
    folder = shlex.quote(state_dir)
    # /logs/agent open to every user too, as Harbor makes it at start (`harbor/environments/base.py:781-803`).
    script = f"mkdir -p {LOG_DIR} {folder} && chmod 777 {LOG_DIR} && chown -R {owner} {folder} && chmod 600 {paths}"
    await sandbox.exec(["sh", "-c", script], user="root", timeout_s=30.0)


async def agent_owner(sandbox: Sandbox) -> str:
    """`uid:gid` of the sandbox's default user, the one the agent runs as (the image's USER or the task's
    `[agent] user`), read from inside the sandbox as Harbor does (`id -u`, `id -g`)."""
    result = await sandbox.exec(["sh", "-c", 'echo "harbor-rl-owner $(id -u):$(id -g)"'], timeout_s=30.0)
    match = re.search(r"^harbor-rl-owner (\d+:\d+)$", result.stdout, re.MULTILINE)
    if match is None:
        raise SandboxError(
            f"could not read the agent's uid and gid in the sandbox: {tail(result.stderr, 500)}"
        )
    return match.group(1)
