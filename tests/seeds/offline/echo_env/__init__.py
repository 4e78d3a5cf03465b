"""OpenEnv's Echo environment, as the TRL guide's `from echo_env import EchoEnv` client uses it, but in
this process: the guide's Space URL cannot be reached offline. Same shape (`EchoEnv(base_url=...)`,
`step(EchoAction(message=...))` -> a result whose `.observation` has `echoed_message` and `reward`) and
the same rule as the real server (meta-pytorch/OpenEnv `envs/echo_env/server/echo_environment.py` at
3b64a8d: the message comes back, and the reward is 0.1 per character)."""

from __future__ import annotations

from dataclasses import dataclass

from echo_env.models import EchoAction


@dataclass
class EchoObservation:
    echoed_message: str
    message_length: int
    reward: float
    done: bool = False


@dataclass
class StepResult:
    observation: EchoObservation
    reward: float
    done: bool = False


class EchoEnv:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url  # where the real client would connect; nothing is reached here

    def reset(self) -> StepResult:
        return StepResult(EchoObservation("Echo environment ready!", 0, 0.0), 0.0)

    def step(self, action: EchoAction) -> StepResult:
        length = len(action.message)
        observation = EchoObservation(action.message, length, length * 0.1)
        return StepResult(observation, observation.reward)
