"""The harness protocol: how one agent is installed, pointed at the capture proxy, and run.

A harness is one small module. It says what it adds to a task's sandbox image (installed once, cached
with the image, never at every rollout), and how to run the agent inside a started sandbox against
an OpenAI base URL and session key. The server owns everything else: sessions, sandboxes, verification.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from sandboxes.base import Sandbox


class AgentRun(BaseModel):
    """Everything a harness needs to run one rollout inside a started sandbox."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    instruction: str
    """The task's instruction.md text, given to the agent verbatim."""
    base_url: str
    """OpenAI base URL of the capture proxy as seen from inside the sandbox (ends in /v1)."""
    api_key: str
    """The capture session key; the only credential the agent ever sees."""
    model: str
    workdir: str = "/app"
    """Where the agent starts: the task's workdir, else its image's WORKDIR (the sandbox resolves it)."""
    user: str | None = None
    """`[agent] user`: who the agent runs as; None is the image's USER. The server hands harnesses a
    sandbox whose commands already default to it (`sandboxes.with_default_user`)."""
    timeout_s: float = 600.0
    """Agent wall-clock limit in seconds."""
    step_limit: int = 0
    """Most model calls the agent may make; 0 means no limit (the proxy enforces it too)."""
    purpose: Literal["train", "eval"] = "train"
    solution_dir: Path | None = None
    """The task's solution/ folder on the host (only the oracle harness uses it)."""
    context_length: int | None = None
    """The engine's context (prompt + completion tokens per call, vLLM's max_model_len) when it reports
    one: a harness whose agent asks for a fixed completion size must keep it inside this."""
    max_tokens: int | None = None
    """The session's cap on completion tokens per call, when one is set (the proxy enforces it too)."""
    skills_dir: str | None = None
    """`[environment] skills_dir`: a folder in the sandbox whose skills the harness copies to its agent's
    own skills folder before the agent starts (Harbor's per-agent places); a harness whose agent has no
    skills raises HarnessConfigError, as Harbor fails such a trial."""
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    """`[[environment.mcp_servers]]` (name, transport, url | command + args, headers), for the harness
    to hand to its agent in the agent's own config format."""
    solution_env: dict[str, str] = Field(default_factory=dict)
    """`[solution] env`, `${VAR}` already read from the host (the oracle's)."""
    extra: dict[str, Any] = Field(default_factory=dict)


class AgentOutcome(BaseModel):
    """What the harness reports after the agent stopped (the verifier runs afterwards, elsewhere)."""

    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    """Why the harness itself failed (not the agent's task failure)."""
    tool_calls_by_name: dict[str, int] = Field(default_factory=dict)
    tool_failures_by_name: dict[str, int] = Field(default_factory=dict)
    log_tail: str = ""
    """Last part of the agent's output, for the inspector."""

    @property
    def tool_failures(self) -> int:
        return sum(self.tool_failures_by_name.values())


@runtime_checkable
class Harness(Protocol):
    """Two optional attributes, read where present: `multi_step_task` (default True: a rollout of one
    model call is degenerate) and `agent_in_sandbox` (default True: the agent calls the model from
    inside the sandbox, which therefore gets a route to the capture proxy)."""

    name: str

    def image_layer(self) -> ImageLayer | None:
        """What to add to the task image; None when the harness needs nothing installed."""
        ...

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        """Run the agent to completion (or timeout) inside `sandbox`. Never raises for agent failures."""
        ...
