"""OpenEnv's reward hooks on a TRL-style class (`tasks.environments.Environment`) and OpenEnv's
`CodeSafetyTransform`, checked with OpenEnv's own types (openenv 0.10.0: its `Observation`, its
`Rubric`) beside ours."""

from __future__ import annotations

import pytest
from openenv.core.env_server.types import Observation
from openenv.core.rubrics import Rubric as OpenEnvRubric

from harnesses.env_factory import EnvironmentFactory
from tasks.environments import Environment
from tasks.rubrics import CodeSafetyTransform, Rubric, TrajectoryRubric


class Exact(Rubric):
    def forward(self, action, observation) -> float:
        return float(action == observation["target"])


class ExactOpenEnv(OpenEnvRubric):
    def forward(self, action, observation) -> float:
        return float(action == observation["target"])


class LastMove(TrajectoryRubric):
    def score_trajectory(self, trajectory) -> float:
        return float(len(trajectory))


class Game(Environment):
    """A TRL-style class on the base: its only tool is the one it writes."""

    rubric_class: type = Exact

    def __init__(self) -> None:
        super().__init__(rubric=self.rubric_class(), transform=CodeSafetyTransform(penalty=-0.5))
        self.reward = 0.0

    def reset(self, target: str = "x", **row) -> str | None:
        self._reset_rubric()
        self.target = target
        return "Say the word."

    def say(self, word: str) -> str:
        """
        Say a word.

        Args:
            word: The word to say

        Returns:
            Whether it was the one.
        """
        observation = self._apply_transform({"target": self.target, "metadata": {"last_code": word}})
        self.reward = self._apply_rubric(word, observation) + (observation.get("reward") or 0.0)
        return "yes" if self.reward > 0 else "no"


@pytest.mark.parametrize("rubric", [Exact, ExactOpenEnv])
async def test_a_tool_scores_with_its_rubric_through_the_hooks(rubric) -> None:
    cls = type("Game_" + rubric.__name__, (Game,), {"rubric_class": rubric})
    factory = EnvironmentFactory(cls)
    assert list(factory.tools) == ["say"]  # the hooks, rubric and transform are no tools
    env = factory.create()
    await factory.reset(env, {"target": "crane"})
    assert await factory.call_tool(env, "say", {"word": "crane"}) == "yes" and env.reward == 1.0
    assert await factory.call_tool(env, "say", {"word": "open('x')"}) == "no" and env.reward == -0.5


async def test_reset_rubric_clears_a_trajectory_and_no_rubric_scores_zero() -> None:
    env = Environment(rubric=LastMove())
    assert env._apply_rubric("a", {"done": False}) == 0.0  # intermediate
    assert env._apply_rubric("b", {"done": True}) == 2.0  # two steps so far
    env._reset_rubric()
    assert env._apply_rubric("c", {"done": True}) == 1.0  # a fresh trajectory
    assert await Environment()._apply_rubric_async("a", {}) == 0.0
    assert Environment()._apply_transform({"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("code", "violation", "reward"),
    [
        ("import os\nos.listdir('.')", "import os", -1.0),
        ("from subprocess import run", "import subprocess", -1.0),
        ("import os.path", "import os", -1.0),
        ("eval('1+1')", "eval", -1.0),
        ("__import__('os')", "__import__", -1.0),
        ('print("import os")', None, 0.0),  # a string is no import
        ("def myopen():\n    pass\nmyopen()", None, 0.0),
        ("def broken(:", None, 0.0),  # does not parse: no violation (syntax is a quality transform's)
    ],
)
def test_code_safety_on_openenvs_observation_and_a_dict(code, violation, reward) -> None:
    transform = CodeSafetyTransform()
    observation = transform(Observation(metadata={"last_code": code}))
    assert observation.reward == reward and observation.metadata.get("safety_violation") == violation
    as_dict = transform({"metadata": {"last_code": code}, "reward": None})
    assert as_dict["reward"] == reward and as_dict["metadata"].get("safety_violation") == violation


def test_code_safety_leaves_an_observation_without_code_alone() -> None:
    observation = Observation(reward=0.3)
    assert CodeSafetyTransform()(observation).reward == 0.3
    assert CodeSafetyTransform()({"text": "hi"}) == {"text": "hi"}
