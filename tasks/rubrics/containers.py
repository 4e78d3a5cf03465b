"""Containers that compose rubrics, as `nn.Sequential` and friends compose modules.

A container is async when any child is: then calling it returns a coroutine, and children that are
independent (WeightedSum) run concurrently. A child that returns None (unscoreable) makes the
container's score None too: a partial reward is not a reward.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tasks.rubrics.base import Rubric, Score, _maybe_await
from tasks.rubrics.errors import RubricCallError, RubricConfigError


class _Container(Rubric):
    @property
    def is_async(self) -> bool:
        return any(child.is_async for child in self.children())


def _require_rubric(value: Any, where: str) -> Rubric:
    if not isinstance(value, Rubric):
        raise RubricConfigError(f"{where}: expected a Rubric, got {type(value).__name__}")
    return value


class Sequential(_Container):
    """Run children in order and stop at the first 0 (it gates the rest); else the last child's score.

    `Sequential(Gate(Compiles()), PassesTests())`: tests only count once the code compiles.
    """

    def __init__(self, *rubrics: Rubric) -> None:
        super().__init__()
        for i, rubric in enumerate(rubrics):
            setattr(self, f"rubric_{i}", _require_rubric(rubric, f"Sequential argument {i}"))
        self._rubric_list = list(rubrics)

    def forward(self, action: Any, observation: Any) -> Score:
        result: Score = 1.0
        for rubric in self._rubric_list:
            result = rubric(action, observation)
            if result is None or result == 0.0:
                return result
        return result

    async def _forward_async(self, action: Any, observation: Any) -> Score:
        result: Score = 1.0
        for rubric in self._rubric_list:
            result = await _maybe_await(rubric(action, observation))
            if result is None or result == 0.0:
                return result
        return result

    def __len__(self) -> int:
        return len(self._rubric_list)

    def __getitem__(self, index: int) -> Rubric:
        return self._rubric_list[index]


class Gate(_Container):
    """The child's score when it reaches `threshold`, else 0 (a hard constraint)."""

    _state_keys = ("threshold",)

    def __init__(self, rubric: Rubric, threshold: float = 1.0) -> None:
        super().__init__()
        self.rubric = _require_rubric(rubric, "Gate")
        self.threshold = float(threshold)

    def _gate(self, score: Score) -> Score:
        return None if score is None else (score if score >= self.threshold else 0.0)

    def forward(self, action: Any, observation: Any) -> Score:
        return self._gate(self.rubric(action, observation))

    async def _forward_async(self, action: Any, observation: Any) -> Score:
        return self._gate(await _maybe_await(self.rubric(action, observation)))


class WeightedSum(_Container):
    """`sum(w_i * score_i)` with weights that sum to 1; async children are awaited concurrently."""

    _state_keys = ("weights",)

    def __init__(self, rubrics: list[Rubric], weights: list[float]) -> None:
        super().__init__()
        if len(rubrics) != len(weights):
            raise RubricConfigError(f"WeightedSum: {len(rubrics)} rubrics but {len(weights)} weights")
        if not math.isclose(sum(weights), 1.0, abs_tol=1e-6):
            raise RubricConfigError(f"WeightedSum: weights must sum to 1.0, got {sum(weights)}")
        for i, rubric in enumerate(rubrics):
            setattr(self, f"rubric_{i}", _require_rubric(rubric, f"WeightedSum rubrics[{i}]"))
        self._rubric_list = list(rubrics)
        self.weights = [float(w) for w in weights]

    def _combine(self, scores: list[Score]) -> Score:
        if any(score is None for score in scores):
            return None
        return sum(w * s for w, s in zip(self.weights, scores, strict=True))  # type: ignore[operator]

    def forward(self, action: Any, observation: Any) -> Score:
        return self._combine([rubric(action, observation) for rubric in self._rubric_list])

    async def _forward_async(self, action: Any, observation: Any) -> Score:
        scores = await asyncio.gather(*(_maybe_await(r(action, observation)) for r in self._rubric_list))
        return self._combine(list(scores))


class RubricList(_Container):
    """A list of rubrics that registers each one (for `named_rubrics`, hooks, state); not a scorer."""

    def __init__(self, rubrics: Iterable[Rubric] = ()) -> None:
        super().__init__()
        self._rubric_list: list[Rubric] = []
        for rubric in rubrics:
            self.append(rubric)

    def append(self, rubric: Rubric) -> None:
        index = len(self._rubric_list)
        setattr(self, str(index), _require_rubric(rubric, f"RubricList[{index}]"))
        self._rubric_list.append(rubric)

    def forward(self, action: Any, observation: Any) -> Score:
        raise RubricCallError(
            "RubricList is a container: call its members, or wrap them in WeightedSum/Sequential"
        )

    def __len__(self) -> int:
        return len(self._rubric_list)

    def __getitem__(self, index: int) -> Rubric:
        return self._rubric_list[index]

    def __iter__(self) -> Iterator[Rubric]:
        return iter(self._rubric_list)


class RubricDict(_Container):
    """Rubrics by name (e.g. one per task type, routed by the environment); not a scorer."""

    def __init__(self, rubrics: Mapping[str, Rubric] | None = None) -> None:
        super().__init__()
        for name, rubric in (rubrics or {}).items():
            self[name] = rubric

    def __setitem__(self, name: str, rubric: Rubric) -> None:
        if not name.isidentifier():
            raise RubricConfigError(f"RubricDict key {name!r} must be a Python identifier")
        setattr(self, name, _require_rubric(rubric, f"RubricDict[{name!r}]"))

    def __getitem__(self, name: str) -> Rubric:
        try:
            return self._rubric_children[name]
        except KeyError:
            raise KeyError(f"no rubric {name!r}; have {', '.join(self._rubric_children) or 'none'}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._rubric_children

    def __len__(self) -> int:
        return len(self._rubric_children)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rubric_children)

    def keys(self) -> list[str]:
        return list(self._rubric_children)

    def items(self) -> list[tuple[str, Rubric]]:
        return list(self._rubric_children.items())

    def forward(self, action: Any, observation: Any) -> Score:
        raise RubricCallError("RubricDict is a container: call `rubrics[name](action, observation)`")
