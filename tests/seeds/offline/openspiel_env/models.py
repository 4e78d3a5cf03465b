"""OpenSpiel's action, observation and state, field for field as OpenEnv's `envs/openspiel_env/models.py`
(meta-pytorch/OpenEnv at 685de411) declares them, with the fields of OpenEnv's `Action` (`metadata`) and
`Observation` (`done`, `reward`, `metadata`) bases written in (importing them loads OpenEnv's server
stack, which a stand-in does not need)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class OpenSpielAction(BaseModel):
    """An action id from `legal_actions`, for the game `game_name`."""

    model_config = ConfigDict(extra="forbid")

    action_id: int
    game_name: str = "catch"
    game_params: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenSpielObservation(BaseModel):
    """What the agent sees: its information state tensor, its legal actions, the phase."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    info_state: list[float]
    legal_actions: list[int]
    game_phase: str = "playing"
    current_player_id: int = 0
    opponent_last_action: int | None = None
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenSpielState(BaseModel):
    episode_id: str | None = None
    step_count: int = 0
    game_name: str = "catch"
    agent_player: int = 0
    opponent_policy: str = "random"
    game_params: dict[str, Any] = Field(default_factory=dict)
    num_players: int = 1
