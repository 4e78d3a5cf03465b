"""SessionRecord: one row of the sessions table, as the rest of the code sees it."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field

from capture_proxy.models import Purpose, SessionStatus, TrainingTrace, TrainingTurn

TERMINAL_STATUSES: frozenset[str] = frozenset(get_args(SessionStatus)) - {"running"}
ROLLOUT_KEY = "rollout"
"""Key of a session's `metadata` under which `harbor serve` keeps its rollout's own facts (timings, tool
counts, verifier output); the inspector reads them from there."""


class SessionRecord(BaseModel):
    """A capture session: who may call, where calls go, and how the rollout ended."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    session_id: str = Field(min_length=1, max_length=128)
    api_key_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 hex of the session key the agent sends; the plain key is never stored."""
    status: SessionStatus = "running"
    purpose: Purpose = "train"
    model: str
    llm_url: str
    upstream_api_key: str | None = None
    """Key the proxy sends upstream (never shown to the agent)."""
    upstream_auth_header: str | None = None
    """The header that key goes in, sent as is; None: `Authorization: Bearer <key>`."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    max_model_calls: int = Field(default=0, ge=0)
    """Step budget; 0 means no limit."""
    multi_step_task: bool = False
    task_id: str | None = None
    harness: str | None = None
    sandbox: str | None = None
    reward: float | None = None
    """The rollout's reward; None means unscoreable (never read it as 0)."""
    rewards: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    """Unix time, seconds."""
    finished_at: float | None = None
    """Unix time the session left `running`; set by the store when a terminal status is recorded."""
    num_turns: int = Field(default=0, ge=0)
    """Turns stored for this session; maintained by the store as turns are added."""
    owner: str | None = Field(default=None, max_length=255)
    """Id of the server running the session (`harbor serve --server-id`): on a store several servers
    share, a restarting server fails only its own leftover sessions. None: no owner recorded."""

    def trace(self, turns: list[TrainingTurn]) -> TrainingTrace:
        """The rollout as a TrainingTrace: these turns plus the session's facts (an error goes into
        `metadata["error"]`, where the inspector and the trainer look for it)."""
        metadata = dict(self.metadata)
        if self.error:
            metadata["error"] = self.error
        return TrainingTrace(
            session_id=self.session_id,
            purpose=self.purpose,
            turns=turns,
            multi_step_task=self.multi_step_task,
            status=self.status,
            model=self.model,
            task_id=self.task_id,
            harness=self.harness,
            sandbox=self.sandbox,
            reward=self.reward,
            rewards=dict(self.rewards),
            metadata=metadata,
        )
