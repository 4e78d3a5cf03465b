"""TextArena's action, observation and state, field for field as OpenEnv's `envs/textarena_env/models.py`
(meta-pytorch/OpenEnv at 685de411) declares them, with the fields of OpenEnv's `Action` (`metadata`) and
`Observation` (`done`, `reward`, `metadata`) bases written in: importing those bases loads OpenEnv's
server stack (seconds), and a stand-in needs only their shape."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TextArenaMessage(BaseModel):
    """Single message observed by a player."""

    sender_id: int
    content: str
    category: str


class TextArenaAction(BaseModel):
    """Action issued by the agent for TextArena games."""

    model_config = ConfigDict(extra="forbid")

    message: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextArenaObservation(BaseModel):
    """Observation returned from any TextArena game."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    prompt: str
    messages: list[TextArenaMessage] = Field(default_factory=list)
    current_player_id: int = 0
    legal_players: list[int] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextArenaState(BaseModel):
    """Structured state snapshot for the server."""

    episode_id: str | None = None
    step_count: int = 0
    env_id: str
    num_players: int
    max_turns: int | None = None
    turn: int = 0
    last_reward: float = 0.0
    last_info: dict[str, Any] = Field(default_factory=dict)
    raw_state: dict[str, Any] = Field(default_factory=dict)
