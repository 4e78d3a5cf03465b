"""OpenEnv's TextArena environment, as the TRL guide's `from textarena_env import TextArenaAction,
TextArenaEnv` client uses it, but in this process: the guide's Space URL cannot be reached offline.

The client has the shape of OpenEnv's (`envs/textarena_env/client.py`, meta-pytorch/OpenEnv at
685de411): `TextArenaEnv(base_url=...)`, `reset()` and `step(TextArenaAction(message=...))` return a
result with `.observation` (a TextArenaObservation: `messages`, `prompt`, `done`, `reward`, ...), `.reward`
and `.done`, as `_parse_result` builds it; `state()`, `close()`, and `sync()` (the synchronous client;
this one is synchronous already, so it is itself). Each client holds one server session (`server.py`:
the real TextArena Wordle game); `close()` releases it, and a call after that opens a fresh session, as
OpenEnv's client up to 0.11 reconnects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textarena_env.models import TextArenaAction, TextArenaMessage, TextArenaObservation, TextArenaState
from textarena_env.server import TextArenaEnvironment

__all__ = ["TextArenaAction", "TextArenaEnv", "TextArenaMessage", "TextArenaObservation", "TextArenaState"]


@dataclass
class StepResult:
    """OpenEnv's `openenv.core.client_types.StepResult`."""

    observation: TextArenaObservation
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None


class TextArenaEnv:
    def __init__(self, base_url: str, **kwargs: Any) -> None:
        self.base_url = base_url  # where the real client would connect; nothing is reached here
        self.session: TextArenaEnvironment | None = None

    def _session(self) -> TextArenaEnvironment:
        if self.session is None:
            self.session = TextArenaEnvironment()
        return self.session

    def reset(self, **kwargs: Any) -> StepResult:
        return self._result(self._session().reset(**kwargs))

    def step(self, action: TextArenaAction, **kwargs: Any) -> StepResult:
        return self._result(self._session().step(action))

    def state(self) -> TextArenaState:
        return self._session().state

    def close(self) -> None:
        self.session = None

    def sync(self) -> TextArenaEnv:
        return self

    def __enter__(self) -> TextArenaEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _result(observation: TextArenaObservation) -> StepResult:
        # The wire carries the observation's reward and done beside it; the client copies them back.
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)
