"""`mini-swe-agent`: SWE-agent's minimal bash-only agent (PyPI `mini-swe-agent`, pinned), run unchanged.

Install: the pinned wheels and all dependencies are downloaded on the host (`harnesses.assets`) and
installed into their own virtualenv at /opt/harbor-rl/mini-swe-agent, so the agent's Python never
shadows the task's `python3`. Pip itself runs from its wheel, so the image needs no pip and no network.

Run: `mini-swe-agent --yolo --model openai/<model> --task <instruction> --cost-limit 0
--exit-immediately`, pointed at the capture proxy through OPENAI_BASE_URL / OPENAI_API_BASE with the
session key as OPENAI_API_KEY. The step limit becomes `agent.step_limit` and the agent timeout
`agent.wall_time_limit_seconds` (a little under the hard `timeout`, so the agent stops cleanly and its
trajectory is complete). Tool counts come from the trajectory it writes to /logs/agent.

Task extras, as Harbor treats them (`harbor/agents/installed/mini_swe_agent.py`): it has no skills, so a
task with a skills_dir is refused, and no MCP client, so the task's MCP servers are listed in a block
appended to the instruction (Harbor's text, verbatim); servers with headers are refused.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from harnesses._common import LOG_DIR, tail, timeout_grace
from harnesses.assets import ensure_asset, pip_download
from harnesses.base import AgentOutcome, AgentRun
from harnesses.mcp import mcp_servers
from harnesses.skills import refuse_skills
from harnesses.tool_metrics import ToolResult, summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from sandboxes.base import Sandbox

VERSION = "2.4.6"
LITELLM_VERSION = "1.75.6"
"""mini-swe-agent's model client, pinned (it asks for litellm>=1.75.5, and pip takes the newest): every
rollout starts a fresh agent, and `import litellm` is most of its start-up. Measured here, the same
machine, interleaved: 1.110.2 took 5.0-5.2 CPU-s to import, 1.75.6 3.4-3.5 CPU-s. A pin also keeps
the image the same from one day to the next."""
OPENAI_VERSION = "1.99.9"
"""litellm's own client library, pinned to the release litellm 1.75.6 came out with (it asks for
openai>=1.99.5): openai 3.57.0 took 1.0 CPU-s to import, and the agent's start-up (mini-swe-agent's
litellm model) went from 2.6-2.8 to 1.8-2.2 CPU-s with 1.99.9, measured here, interleaved."""
INSTALL_DIR = "/opt/harbor-rl/mini-swe-agent"
BINARY = f"{INSTALL_DIR}/bin/mini-swe-agent"
TRAJECTORY = f"{LOG_DIR}/mini-swe-agent.traj.json"
OUTPUT_LOG = f"{LOG_DIR}/mini-swe-agent.txt"
_WHEELS_IN_IMAGE = "/opt/harbor-rl/mini-swe-agent-wheels"
"""Under /opt/harbor-rl so the COPY creates that folder first: the local backend only binds the top-level
folders that exist when a RUN starts."""

# How mini-swe-agent ends a run normally (anything else is an exception name: a harness failure).
AGENT_EXITS = frozenset({"Submitted", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError"})
# Seconds between mini-swe-agent's own wall-clock limit and the hard kill.
_SOFT_LIMIT_MARGIN_S = 15


class MiniSweAgentHarness:
    name = "mini-swe-agent"

    def __init__(
        self,
        *,
        version: str = VERSION,
        litellm_version: str = LITELLM_VERSION,
        openai_version: str = OPENAI_VERSION,
        python_version: str = "3.11",
        model_retries: int = 3,
        command_timeout_s: int = 60,
    ) -> None:
        self.version = version
        self.litellm_version = litellm_version
        self.openai_version = openai_version
        self.python_version = python_version
        """CPython version of the sandbox image's `python3` (the wheels are built for it)."""
        self.model_retries = model_retries
        """Attempts per model call (mini-swe-agent's default of 10 with back-off waits minutes on a dead proxy)."""
        self.command_timeout_s = command_timeout_s
        """Limit for each bash command the agent runs."""

    def image_layer(self) -> ImageLayer:
        """Pinned wheels from the host cache, installed into a private venv (fetches them on first use)."""
        requirements = [
            f"mini-swe-agent=={self.version}", f"litellm=={self.litellm_version}", f"openai=={self.openai_version}"
        ]  # fmt: skip
        name = f"mini-swe-agent-{self.version}-litellm-{self.litellm_version}-openai-{self.openai_version}"
        assets = ensure_asset(
            f"{name}-cp{self.python_version.replace('.', '')}",
            lambda folder: pip_download(
                [*requirements, "pip"], folder / "wheels", python_version=self.python_version
            ),
        )
        return ImageLayer(
            name=name,
            dockerfile_lines=install_lines(requirements),
            context_dir=assets,
        )

    def command(self, run: AgentRun) -> list[str]:
        """The agent's argv (without the timeout wrapper)."""
        config = [
            "-c", "mini.yaml",
            "-c", f"agent.step_limit={max(run.step_limit, 0)}",
            "-c", f"agent.wall_time_limit_seconds={soft_time_limit(run.timeout_s)}",
            "-c", f"environment.cwd={run.workdir}",
            "-c", f"environment.timeout={self.command_timeout_s}",
        ]  # fmt: skip
        return [
            BINARY, "--yolo", "--model", f"openai/{run.model}", "--task", task_text(run),
            "--cost-limit", "0", "--exit-immediately", "--output", TRAJECTORY, *config,
        ]  # fmt: skip

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            # litellm reads OPENAI_API_BASE, the openai SDK OPENAI_BASE_URL: set both to the proxy.
            "OPENAI_BASE_URL": run.base_url,
            "OPENAI_API_BASE": run.base_url,
            "OPENAI_API_KEY": run.api_key,
            "MSWEA_CONFIGURED": "true",  # skip the interactive first-run set-up
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",  # our model has no price in litellm's table
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/harbor-rl-mini-swe-agent",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.model_retries),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # do not fetch the price table from GitHub
            "NO_COLOR": "1",
            "TERM": "dumb",
        }

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        refuse_skills(self.name, run)
        argv = [
            "bash", "-c", f'mkdir -p {LOG_DIR} && "$@" > {OUTPUT_LOG} 2>&1; code=$?; tail -c 20000 {OUTPUT_LOG}; exit $code',
            "bash", "timeout", "--kill-after=10", str(max(1, int(run.timeout_s))), *self.command(run),
        ]  # fmt: skip
        result = await sandbox.exec(
            argv, cwd=run.workdir, env=self.environment(run), timeout_s=timeout_grace(run.timeout_s)
        )
        timed_out = result.timed_out or result.exit_code == 124
        output = result.stdout + result.stderr
        try:
            data = json.loads(await sandbox.download_file(TRAJECTORY))
        except Exception as exc:  # noqa: BLE001 - missing (any backend's error) or cut short: the same here
            return AgentOutcome(
                exit_code=result.exit_code,
                timed_out=timed_out,
                # Killed before its first step was saved is a timeout, not a harness failure.
                error=None
                if timed_out
                else f"mini-swe-agent left no readable trajectory ({type(exc).__name__}: {exc}); "
                f"exit code {result.exit_code}",
                log_tail=tail(output),
            )
        summary = parse_trajectory(data)
        metrics = summarize(summary.tool_results)
        return AgentOutcome(
            exit_code=result.exit_code,
            timed_out=timed_out or summary.exit_status == "TimeExceeded",
            error=summary.error,
            tool_calls_by_name=metrics.calls_by_name,
            tool_failures_by_name=metrics.failures_by_name,
            log_tail=tail(
                f"{output}\n[exit status: {summary.exit_status or 'none'}; model calls: {summary.api_calls}]"
            ),
        )


def task_text(run: AgentRun) -> str:
    """The instruction, and the task's MCP servers listed after it as Harbor does
    (`harbor/agents/installed/mini_swe_agent.py:852-861`)."""
    servers = mcp_servers(run, "mini-swe-agent", headers=False).servers
    if not servers:
        return run.instruction
    block = "\n\nMCP Servers:\nThe following MCP servers are available for this task.\n"
    for server in servers:
        if server.transport == "stdio":
            block += f"- {server.name}: stdio transport, command: {server.command} {' '.join(server.args)}\n"
        else:
            block += f"- {server.name}: {server.transport} transport, url: {server.url}\n"
    return run.instruction + block


def install_lines(requirements: list[str]) -> list[str]:
    """Dockerfile lines that install `requirements` offline from the `wheels/` folder of the context."""
    python = f"{INSTALL_DIR}/bin/python"
    # pip runs straight from its wheel (python pip-X.whl/pip), so the image needs no pip of its own.
    return [
        f"COPY wheels/ {_WHEELS_IN_IMAGE}/",
        f"RUN python3 -m venv --without-pip {INSTALL_DIR}"
        f" && pip_wheel=$(ls {_WHEELS_IN_IMAGE}/pip-*.whl | head -n 1)"
        f" && {python} $pip_wheel/pip install --no-index --no-cache-dir --disable-pip-version-check"
        f" --find-links {_WHEELS_IN_IMAGE} {' '.join(repr(r) for r in requirements)}"
        f" && rm -rf {_WHEELS_IN_IMAGE} && {INSTALL_DIR}/bin/mini-swe-agent --help > /dev/null",
    ]


def soft_time_limit(timeout_s: float) -> int:
    """mini-swe-agent's own wall-clock limit: under the hard limit, never 0 (which means none)."""
    return max(1, int(timeout_s) - _SOFT_LIMIT_MARGIN_S)


class TrajectorySummary(BaseModel):
    exit_status: str = ""
    api_calls: int = 0
    tool_results: list[ToolResult] = Field(default_factory=list)
    error: str | None = None
    """Set when the run ended on an exception rather than one of the agent's own exits."""


def parse_trajectory(data: dict[str, Any]) -> TrajectorySummary:
    """Tool calls, their results and the exit status from a `mini-swe-agent-1.1` trajectory."""
    info = data.get("info") or {}
    messages: list[dict[str, Any]] = data.get("messages") or []
    tool_outputs = {m.get("tool_call_id"): m for m in messages if m.get("role") == "tool"}
    results: list[ToolResult] = []
    for message in messages:
        extra = message.get("extra") or {}
        if message.get("role") == "assistant":
            for action in extra.get("actions") or []:
                observation = tool_outputs.get(action.get("tool_call_id"))
                results.append(_bash_result(observation))
        elif extra.get("interrupt_type") == "FormatError":
            # A rejected call (unknown tool, bad arguments): each attempted call failed.
            for name in _attempted_tools(extra.get("response")):
                results.append(
                    ToolResult(name=name, output=str(message.get("content", "")), error_reported=True)
                )
    exit_status = str(info.get("exit_status") or "")
    error = None
    if exit_status and exit_status not in AGENT_EXITS:
        last = (messages[-1].get("extra") or {}) if messages else {}
        detail = str(last.get("exception_str") or (messages[-1].get("content") if messages else "") or "")
        error = f"mini-swe-agent stopped on {exit_status}: {detail[:1000]}"
    api_calls = int((info.get("model_stats") or {}).get("api_calls") or 0)
    return TrajectorySummary(exit_status=exit_status, api_calls=api_calls, tool_results=results, error=error)


def _bash_result(observation: dict[str, Any] | None) -> ToolResult:
    if observation is None:  # e.g. the submit command: mini-swe-agent exits before recording it
        return ToolResult(name="bash")
    extra = observation.get("extra") or {}
    failed = extra.get("returncode") not in (0, None) or bool(extra.get("exception_info"))
    output = extra.get("raw_output")
    return ToolResult(
        name="bash",
        output=str(output if output is not None else observation.get("content", "")),
        error_reported=failed,
    )


def _attempted_tools(response: Any) -> list[str]:
    if not isinstance(response, dict):
        return []
    choices = response.get("choices") or [{}]
    calls = (choices[0].get("message") or {}).get("tool_calls") or []
    return [str((call.get("function") or {}).get("name") or "unknown") for call in calls]
