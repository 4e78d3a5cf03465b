"""OpenEnv's OpenSpiel environment, as TRL's multi-environment example uses it (`from openspiel_env
import OpenSpielEnv`, `from openspiel_env.models import OpenSpielAction`), but in this process: the
guide's Space URL cannot be reached offline.

The client has the shape of OpenEnv's (`envs/openspiel_env/client.py`, meta-pytorch/OpenEnv at
685de411): `OpenSpielEnv(base_url=...)`, `reset()` and `step(OpenSpielAction(action_id=...))` return a
result with `.observation` (`info_state`, `legal_actions`, `game_phase`, `current_player_id`, `done`,
`reward`), `.reward` and `.done`; `state()`, `close()`, `sync()`. Behind it is the real game: OpenSpiel's
(the `open_spiel` package, `pyspiel`) `rl_environment.Environment(game_name)`, turned into observations as
OpenEnv's server does (`envs/openspiel_env/server/openspiel_environment.py`): the agent's `info_state`
and legal actions, `reward` None at reset and the agent's reward after each step, `done` at the last
time step. Catch (the default game) is single-player, so no opponent moves. `SEED` (None: OpenSpiel's
own randomness, as the server) makes the chance events (where the ball starts) repeatable in tests.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from openspiel_env.models import OpenSpielAction, OpenSpielObservation, OpenSpielState

__all__ = ["OpenSpielAction", "OpenSpielEnv", "OpenSpielObservation", "OpenSpielState"]

SEED: int | None = None
"""Seed of each new session's chance event sampler; None draws fresh randomness, as the server does."""


@dataclass
class StepResult:
    """OpenEnv's `openenv.core.client_types.StepResult`."""

    observation: OpenSpielObservation
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None


class OpenSpielEnvironment:
    """One session: the OpenEnv server's reset/step over OpenSpiel's rl_environment (one player)."""

    def __init__(self, game_name: str = "catch", game_params: dict[str, Any] | None = None) -> None:
        from open_spiel.python import rl_environment

        sampler = rl_environment.ChanceEventSampler(seed=SEED) if SEED is not None else None
        self.game_params = dict(game_params or {})
        self._env = rl_environment.Environment(game_name, chance_event_sampler=sampler, **self.game_params)
        if self._env.num_players != 1:
            raise ValueError(
                f"the stand-in plays one-player games only; {game_name} has {self._env.num_players}"
            )
        self._state = OpenSpielState(game_name=game_name, game_params=self.game_params)

    def reset(self) -> OpenSpielObservation:
        self._state.episode_id, self._state.step_count = str(uuid.uuid4()), 0
        return self._observation(self._env.reset())

    def step(self, action: OpenSpielAction) -> OpenSpielObservation:
        if not isinstance(action, OpenSpielAction):
            raise ValueError(f"Expected OpenSpielAction, got {type(action)}")
        time_step = self._env.step([action.action_id])
        self._state.step_count += 1
        return self._observation(time_step)

    @property
    def state(self) -> OpenSpielState:
        return self._state

    def _observation(self, time_step: Any) -> OpenSpielObservation:
        phase = "terminal" if time_step.last() else "initial" if time_step.first() else "playing"
        return OpenSpielObservation(
            info_state=[float(v) for v in time_step.observations["info_state"][0]],
            legal_actions=list(time_step.observations["legal_actions"][0]),
            game_phase=phase,
            current_player_id=time_step.observations["current_player"],
            done=time_step.last(),
            reward=None if time_step.rewards is None else float(time_step.rewards[0]),
        )


class OpenSpielEnv:
    def __init__(self, base_url: str, **kwargs: Any) -> None:
        self.base_url = base_url  # where the real client would connect; nothing is reached here
        self.session: OpenSpielEnvironment | None = None

    def _session(self) -> OpenSpielEnvironment:
        if self.session is None:
            self.session = OpenSpielEnvironment()
        return self.session

    def reset(self, **kwargs: Any) -> StepResult:
        return self._result(self._session().reset())

    def step(self, action: OpenSpielAction, **kwargs: Any) -> StepResult:
        return self._result(self._session().step(action))

    def state(self) -> OpenSpielState:
        return self._session().state

    def close(self) -> None:
        self.session = None

    def sync(self) -> OpenSpielEnv:
        return self

    def __enter__(self) -> OpenSpielEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _result(observation: OpenSpielObservation) -> StepResult:
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)
