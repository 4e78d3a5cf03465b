"""`EchoEnv`: say a target phrase back through the `echo` tool (the smallest white-box environment).

The reward is born here, from a rubric: half for an exact echo, half for character similarity to
the target (partial credit, so a small model that gets close still sees a gradient). The best echo
of the episode counts; an episode without an echo scores 0 (it was played, and earned nothing).

`echo_shaped_reward` is for models that cannot call tools yet (a tiny random model almost never
writes a valid tool call, so every member of a GRPO group would score 0 and nothing is learned): it
also gives up to half credit for writing the target as plain text, so the first steps of learning
have a signal, and an echo through the tool still scores more.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from tasks.rubrics import Rubric, WeightedSum

DEFAULT_TARGET = "Hello World!"


class ExactMatch(Rubric):
    def forward(self, action: str, observation: dict[str, Any]) -> float:
        return 1.0 if action == observation["target"] else 0.0


class CharSimilarity(Rubric):
    """difflib's ratio: 2 * matching characters / total characters."""

    def forward(self, action: str, observation: dict[str, Any]) -> float:
        return difflib.SequenceMatcher(None, action, observation["target"]).ratio()


class EchoRubric(WeightedSum):
    def __init__(self) -> None:
        super().__init__([ExactMatch(), CharSimilarity()], weights=[0.5, 0.5])


class EchoEnv:
    """Echo the target phrase; `reward` is the best rubric score of the episode."""

    def __init__(self) -> None:
        self.rubric = EchoRubric()
        self.target = DEFAULT_TARGET
        self.reward = 0.0
        self.echoes: list[str] = []
        self.done = False

    def reset(self, target: str = DEFAULT_TARGET, **kwargs: Any) -> str | None:
        self.rubric.reset()
        self.target = target
        self.reward = 0.0
        self.echoes = []
        self.done = False
        return None

    def echo(self, message: str) -> str:
        """
        Echo the message back from the environment.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a string, got {type(message).__name__}")
        self.echoes.append(message)
        self.reward = max(self.reward, self.rubric(message, {"target": self.target}))
        self.done = message == self.target
        return message


def echo_reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """The echo rubric's best score; None for samples of other environments."""
    return [env.reward if isinstance(env, EchoEnv) else None for env in environments]


TEXT_CREDIT = 0.5
"""Most a plain-text answer can earn in `echo_shaped_reward` (an echo through the tool earns up to 1)."""


def _assistant_text(completion: Sequence[dict[str, Any]]) -> str:
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def echo_shaped_reward(
    environments: Sequence[Any], completions: Sequence[Sequence[dict[str, Any]]] | None = None, **kwargs: Any
) -> list[float | None]:
    """max(echo rubric score, TEXT_CREDIT * the rubric's score of the model's plain text); None for
    samples of other environments. `completions` are the messages after the prompt (TRL's column)."""
    if completions is None or len(completions) != len(environments):
        raise ValueError("echo_shaped_reward needs the `completions` column, one entry per sample")
    out: list[float | None] = []
    for env, completion in zip(environments, completions, strict=True):
        if not isinstance(env, EchoEnv):
            out.append(None)
            continue
        text = _assistant_text(completion)
        text_score = EchoRubric()(text, {"target": env.target}) if text else 0.0
        out.append(max(env.reward, TEXT_CREDIT * text_score))
    return out
