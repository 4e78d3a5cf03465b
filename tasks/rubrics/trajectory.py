"""Rubrics whose reward is only known at the end of an episode (a game won, a plan that worked).

Each call records `(action, observation)`; until the observation says `done`, the rubric returns
`intermediate_reward`; then `score_trajectory` scores the whole episode and `compute_step_rewards`
spreads that score over the steps (credit assignment). The trajectory lives in CPU memory: move
tensors off the GPU before they reach a rubric, and mind very long episodes.
"""

from __future__ import annotations

from typing import Any

from tasks.rubrics.base import Rubric, Score
from tasks.rubrics.errors import RubricConfigError

Step = tuple[Any, Any]


def is_done(observation: Any) -> bool:
    """`observation.done` or `observation["done"]`; absent means not done."""
    if isinstance(observation, dict):
        return bool(observation.get("done", False))
    return bool(getattr(observation, "done", False))


class TrajectoryRubric(Rubric):
    """Subclasses implement `score_trajectory(trajectory)` and `compute_step_rewards()`."""

    _state_keys = ("intermediate_reward",)

    def __init__(self, intermediate_reward: float = 0.0) -> None:
        super().__init__()
        self.intermediate_reward = float(intermediate_reward)
        self._trajectory: list[Step] = []

    def forward(self, action: Any, observation: Any) -> Score:
        self._trajectory.append((action, observation))
        if is_done(observation):
            return self.score_trajectory(self.trajectory)
        return self.intermediate_reward

    def score_trajectory(self, trajectory: list[Step]) -> Score:
        raise NotImplementedError(f"{type(self).__name__} must implement score_trajectory(trajectory)")

    def compute_step_rewards(self) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} must implement compute_step_rewards()")

    @property
    def trajectory(self) -> list[Step]:
        """The steps so far (a copy)."""
        return list(self._trajectory)

    def reset(self) -> None:
        """Start a new episode: forget the trajectory (call it from the environment's reset)."""
        super().reset()
        self._trajectory = []


class ExponentialDiscountingTrajectoryRubric(TrajectoryRubric):
    """Credit `r_t = gamma ** (T - 1 - t) * R_final`: later steps, closer to the outcome, get more.

    gamma=1 gives every step the final score; gamma=0 gives it to the last step only.
    """

    _state_keys = ("intermediate_reward", "gamma")

    def __init__(self, gamma: float = 0.99, intermediate_reward: float = 0.0) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise RubricConfigError(f"gamma must be in [0, 1], got {gamma}")
        super().__init__(intermediate_reward)
        self.gamma = float(gamma)

    def compute_step_rewards(self) -> list[float]:
        if not self._trajectory:
            return []
        final = self.score_trajectory(self.trajectory)
        if final is None:
            raise RubricConfigError(
                f"{type(self).__name__}: the trajectory has no score (None), so no step rewards exist"
            )
        steps = len(self._trajectory)
        return [final * self.gamma ** (steps - 1 - t) for t in range(steps)]
