"""Rubrics and transforms: reward composition inside an environment (docs/design.md 3.10).

    from tasks.rubrics import Rubric, WeightedSum, Gate

    class Exact(Rubric):
        def forward(self, action, observation) -> float:
            return float(action == observation["target"])

    reward = WeightedSum([Exact(), Gate(Similar(), 0.5)], weights=[0.7, 0.3])(action, observation)

The reward is born in the environment: environments call their rubric in their own tools; the
trainer never invents one.
"""

from tasks.rubrics.base import RemovableHandle, Rubric, Score
from tasks.rubrics.containers import Gate, RubricDict, RubricList, Sequential, WeightedSum
from tasks.rubrics.errors import JudgeError, RubricCallError, RubricConfigError, RubricError
from tasks.rubrics.llm_judge import LLMJudge
from tasks.rubrics.trajectory import ExponentialDiscountingTrajectoryRubric, TrajectoryRubric, is_done
from tasks.rubrics.transforms import (
    CodeSafetyTransform,
    Compose,
    CompositeTransform,
    FunctionTransform,
    NullTransform,
    Transform,
    TruncateText,
)

__all__ = [
    "CodeSafetyTransform",
    "Compose",
    "CompositeTransform",
    "ExponentialDiscountingTrajectoryRubric",
    "FunctionTransform",
    "Gate",
    "JudgeError",
    "LLMJudge",
    "NullTransform",
    "RemovableHandle",
    "Rubric",
    "RubricCallError",
    "RubricConfigError",
    "RubricDict",
    "RubricError",
    "RubricList",
    "Score",
    "Sequential",
    "TrajectoryRubric",
    "Transform",
    "TruncateText",
    "WeightedSum",
    "is_done",
]
