"""`Transform`: observation post-processing inside an environment (TorchRL's shape).

A transform maps an observation to an observation: truncate long tool output, add a penalty for
dangerous commands, redact secrets. Transforms compose: `Compose(a, b)` (or `a >> b`) applies `a`
then `b`. Where a Rubric scores (action, observation), a Transform only sees the observation.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


class Transform:
    """Subclasses implement `__call__(observation) -> observation`."""

    def __call__(self, observation: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(observation)")

    def __rshift__(self, other: Transform) -> Compose:
        return Compose(self, other)


class Compose(Transform):
    """Apply transforms in order; nested Compose objects are flattened."""

    def __init__(self, *transforms: Transform) -> None:
        flat: list[Transform] = []
        for transform in transforms:
            if not callable(transform):
                raise TypeError(f"Compose: {transform!r} is not a transform")
            flat.extend(transform.transforms if isinstance(transform, Compose) else [transform])
        self.transforms = flat

    def __call__(self, observation: Any) -> Any:
        for transform in self.transforms:
            observation = transform(observation)
        return observation

    def __repr__(self) -> str:
        return f"Compose({', '.join(type(t).__name__ for t in self.transforms)})"


CompositeTransform = Compose
"""OpenEnv's name for the same thing."""


class NullTransform(Transform):
    def __call__(self, observation: Any) -> Any:
        return observation


class FunctionTransform(Transform):
    """Wrap a plain function as a transform."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, observation: Any) -> Any:
        return self.fn(observation)


class TruncateText(Transform):
    """Cut string observations to `max_chars`, keeping head and tail (what models need most)."""

    def __init__(self, max_chars: int = 4000, marker: str = "\n[... {n} characters cut ...]\n") -> None:
        if max_chars < 16:
            raise ValueError(f"TruncateText max_chars must be >= 16, got {max_chars}")
        self.max_chars = max_chars
        self.marker = marker

    def __call__(self, observation: Any) -> Any:
        if not isinstance(observation, str) or len(observation) <= self.max_chars:
            return observation
        head = self.max_chars // 2
        tail = self.max_chars - head
        cut = len(observation) - head - tail
        return observation[:head] + self.marker.format(n=cut) + observation[-tail:]


class CodeSafetyTransform(Transform):
    """OpenEnv's coding-environment transform (meta-pytorch/OpenEnv `envs/coding_env/server/transforms.py`
    at 8151a38): the code an observation carries in `metadata["last_code"]` that imports os or subprocess,
    or calls eval, exec, open or __import__, sets the reward to `penalty` and records the violation in
    `metadata["safety_violation"]`; safe code sets a missing reward to 0.0. Read from the syntax tree, so
    `print("import os")` or a function named `myopen` is no violation, nor is code that does not parse
    (syntax is a quality transform's business). The observation is an object with `metadata` and `reward`
    attributes (OpenEnv's `Observation`) or a dict with those keys."""

    MODULES = frozenset({"os", "subprocess"})
    CALLS = frozenset({"eval", "exec", "open", "__import__"})

    def __init__(self, penalty: float = -1.0) -> None:
        self.penalty = penalty

    def violation(self, code: str) -> str | None:
        """What in `code` is dangerous (`import os`, `eval`, ...), or None."""
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".", 1)[0] in self.MODULES:
                    return f"import {name.split('.', 1)[0]}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.CALLS:
                return node.func.id
        return None

    def __call__(self, observation: Any) -> Any:
        is_dict = isinstance(observation, dict)
        metadata = observation.get("metadata") if is_dict else getattr(observation, "metadata", None)
        if not isinstance(metadata, dict) or "last_code" not in metadata:
            return observation
        found = self.violation(str(metadata["last_code"]))
        reward = observation.get("reward") if is_dict else getattr(observation, "reward", None)
        if found is not None:
            metadata["safety_violation"] = found
            reward = self.penalty
        elif reward is None:
            reward = 0.0
        if is_dict:
            observation["reward"] = reward
        else:
            observation.reward = reward
        return observation
