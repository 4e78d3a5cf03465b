"""One agent process in a sandbox, the way the npm agents run: the instruction on stdin, the event log
it prints on stdout kept in /logs/agent, its own `timeout`, and the outcome built from what it did."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnesses._common import LOG_DIR, tail, timeout_grace
from harnesses.base import AgentOutcome, AgentRun
from harnesses.tool_metrics import ToolMetrics

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
) -> AgentProcess:
    """Write the instruction (and `extra_files`, e.g. a config), run `argv` under coreutils `timeout`
    (TERM at the limit, KILL 10 s later, exit 124), and read back the event log it printed."""
    await sandbox.exec(["mkdir", "-p", LOG_DIR, files.state_dir], timeout_s=30.0)
    for path, data in (extra_files or {}).items():
        await sandbox.upload_file(data, path)
    await sandbox.upload_file(run.instruction.encode(), files.instruction)
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
