"""Reward functions over environment instances, as TRL calls them, and their nan-aware aggregation.

    def wordle_reward(environments, **kwargs) -> list[float | None]:
        return [env.reward if env.active == "wordle" else None for env in environments]

A function returns one value per sample; None means "this function does not score this sample"
(another environment's sample, say), and becomes NaN in the table. A sample's total is the weighted
nansum over the functions that scored it; a sample no function scored is None (unscoreable), never 0.
`kwargs` carries the dataset columns, one list entry per sample, which is how `route_by_column` sends
each sample to the functions of its own environment.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnesses.env_factory.errors import RewardFunctionError
from harnesses.errors import HarnessConfigError

RewardFunc = Callable[..., list[float | None]]


def load_reward_function(spec: str) -> RewardFunc:
    """The function `module:function` names (task.toml's `reward_funcs`)."""
    module_name, _, attr = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise HarnessConfigError(f"reward function {spec!r} cannot be loaded: {exc}") from exc
    if not callable(function):
        raise HarnessConfigError(f"reward function {spec!r} is not callable")
    return function


def reward_columns(
    row: Mapping[str, Any], prompt: list[dict[str, Any]], completion: list[dict[str, Any]]
) -> dict[str, list[Any]]:
    """One sample's keywords for the reward functions, as TRL passes them: the dataset columns (the
    running sandbox left out: it is a resource, not data), `prompts` and `completions` (the messages
    after the prompt), one list entry per sample."""
    columns = {k: [v] for k, v in row.items() if k != "sandbox"}
    columns["prompts"] = [prompt]
    columns["completions"] = [completion]
    return columns


def reward_name(func: RewardFunc) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def _checked(func: RewardFunc, values: Any, n: int) -> list[float]:
    name = reward_name(func)
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}; expected a list"
        )
    if len(values) != n:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} values for {n} samples")
    out = []
    for i, value in enumerate(values):
        if value is None:
            out.append(math.nan)
        elif isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
            raise RewardFunctionError(
                f"reward function {name!r}: sample {i} is {value!r}, not a number or None"
            )
        else:
            out.append(float(value))
    return out


@dataclass
class RewardTable:
    """Rewards of `n` samples by `k` functions; NaN where a function did not score a sample."""

    names: list[str]
    values: np.ndarray
    """Shape (n_samples, n_functions)."""
    weights: np.ndarray

    def totals(self) -> list[float | None]:
        """Per sample: weighted nansum over the functions that scored it; None if none did."""
        scored = ~np.isnan(self.values)
        sums = np.nansum(self.values * self.weights, axis=1)
        return [float(s) if any(row) else None for s, row in zip(sums, scored, strict=True)]

    def means(self) -> dict[str, float | None]:
        """Per function: nanmean over the samples it scored (logged as `rewards/<name>`); None if none."""
        out: dict[str, float | None] = {}
        for j, name in enumerate(self.names):
            column = self.values[:, j]
            out[name] = float(np.nanmean(column)) if not np.all(np.isnan(column)) else None
        return out

    def row(self, i: int) -> dict[str, float]:
        """Sample `i`'s scores by function name, unscored ones left out."""
        return {
            name: float(v) for name, v in zip(self.names, self.values[i], strict=True) if not math.isnan(v)
        }


def compute_rewards(
    funcs: Sequence[RewardFunc],
    environments: Sequence[Any],
    weights: Sequence[float] | None = None,
    **kwargs: Any,
) -> RewardTable:
    """Call every function as `func(environments=..., **kwargs)` and tabulate the results."""
    if not funcs:
        raise RewardFunctionError("no reward functions given")
    if weights is not None and len(weights) != len(funcs):
        raise RewardFunctionError(f"{len(weights)} reward weights for {len(funcs)} reward functions")
    n = len(environments)
    columns = [_checked(func, func(environments=list(environments), **kwargs), n) for func in funcs]
    values = np.array(columns, dtype=float).T.reshape(n, len(funcs))
    return RewardTable(
        names=[reward_name(f) for f in funcs],
        values=values,
        weights=np.array(weights if weights is not None else [1.0] * len(funcs), dtype=float),
    )


def combine_rewards(
    funcs: Sequence[RewardFunc],
    environments: Sequence[Any],
    weights: Sequence[float] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """The per-sample totals of `compute_rewards` (weighted nansum; None where nothing scored)."""
    return compute_rewards(funcs, environments, weights, **kwargs).totals()


def route_by_column(column: str, funcs: Mapping[str, RewardFunc], *, name: str | None = None) -> RewardFunc:
    """One reward function that sends each sample to `funcs[row[column]]` and gives None elsewhere.

    `kwargs[column]` holds each sample's value of the dataset column (e.g. `env`: "wordle" | "echo").
    A sample whose value has no function is None (not scored by this one).
    """

    def routed(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
        if column not in kwargs:
            raise RewardFunctionError(f"routing by column {column!r}, but the batch has no such column")
        keys = list(kwargs[column])
        if len(keys) != len(environments):
            raise RewardFunctionError(
                f"column {column!r} has {len(keys)} values for {len(environments)} samples"
            )
        out: list[float | None] = [None] * len(environments)
        for key, func in funcs.items():
            idx = [i for i, k in enumerate(keys) if k == key]
            if not idx:
                continue
            sub = {
                k: [v[i] for i in idx] if isinstance(v, list) and len(v) == len(keys) else v
                for k, v in kwargs.items()
            }
            values = _checked(func, func(environments=[environments[i] for i in idx], **sub), len(idx))
            for i, value in zip(idx, values, strict=True):
                out[i] = None if math.isnan(value) else value
        return out

    routed.__name__ = name or f"route_by_{column}"
    return routed


def env_attribute(attribute: str = "reward") -> RewardFunc:
    """`[env.<attribute> for env in environments]` (TRL's usual reward), None where it is unset."""

    def reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return [getattr(env, attribute, None) for env in environments]

    reward.__name__ = f"env_{attribute}"
    return reward
