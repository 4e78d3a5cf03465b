"""The reward is born in the environment: `resolve_env_reward` enforces it (docs/design.md 3.8).

A rollout's reward can surface in two places: the tool results (the environment reports a reward as
it steps) and `verify().env_reward` (the session's end-of-episode summary). `verify()` must forward
the environment's reward, never make up its own, so when both exist they must agree; when neither
exists the rollout has no reward, which is an error, never a silent 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from harnesses.errors import HarnessError

REL_TOL = 1e-9
ABS_TOL = 1e-6


class EnvRewardError(HarnessError, ValueError):
    """The rollout's reward is missing, or its two sources disagree."""


def tool_result_reward(entry: Any) -> float | None:
    """The reward a tool-trace entry carries: `entry.result.reward`, `entry.reward`, or the dict forms."""
    result = entry.get("result", entry) if isinstance(entry, dict) else getattr(entry, "result", entry)
    reward = result.get("reward") if isinstance(result, dict) else getattr(result, "reward", None)
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise EnvRewardError(f"a tool result carries reward {reward!r}, which is not a number")
    return None if reward is None else float(reward)


def resolve_env_reward(tool_trace: Iterable[Any], verify_result: Any) -> float:
    """The last non-None tool-result reward, cross-checked with `verify_result.env_reward`."""
    trace_reward = None
    for entry in reversed(list(tool_trace)):
        trace_reward = tool_result_reward(entry)
        if trace_reward is not None:
            break
    verify_reward = None if verify_result is None else getattr(verify_result, "env_reward", None)
    disagree = (
        trace_reward is not None
        and verify_reward is not None
        and not math.isclose(trace_reward, verify_reward, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    )
    if disagree:
        raise EnvRewardError(
            "verify.env_reward must forward the environment reward from the rollout: the tool results "
            f"gave {trace_reward!r}, verify() gave {verify_reward!r}"
        )
    if trace_reward is not None:
        return trace_reward
    if verify_reward is not None:
        return float(verify_reward)
    raise EnvRewardError("rollout did not produce an environment reward")
