"""Group-relative advantages (docs/design.md 3.9): `(r - mean) / (std + 1e-8)` over a group's scoreable members.

A None reward is unscoreable: it is left out of the mean and the std and gets no advantage (its rows are
not trained), never counted as 0. The std is the sample std (ddof=1), as `torch.std` gives TRL. A group
whose scoreable rewards are all equal (or that has fewer than two) carries no signal: its advantages are
all 0 and `zero_spread` says so, so the trainer can report the fraction of such groups.
`negative_scale` multiplies the below-average members' advantages (AsyncGRPOConfig.negative_advantage_scale).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EPS = 1e-8


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: tuple[float | None, ...]
    """One per member, None where the reward was None."""
    mean: float | None
    std: float | None
    """Sample std of the scoreable rewards (None with fewer than two)."""
    num_scoreable: int
    zero_spread: bool
    """No signal: fewer than two scoreable members, or all of them equal."""


def group_advantages(rewards: Sequence[float | None], negative_scale: float = 1.0) -> GroupAdvantages:
    scored = [float(r) for r in rewards if r is not None]
    for r in scored:
        if not math.isfinite(r):
            raise ValueError(f"reward {r!r} is not finite; return None for an unscoreable rollout")
    if not scored:
        return GroupAdvantages(tuple(None for _ in rewards), None, None, 0, True)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1)) if len(scored) > 1 else None
    zero_spread = std is None or std == 0.0
    advantages = tuple(
        None
        if r is None
        else (0.0 if zero_spread else _scaled((float(r) - mean) / (std + EPS), negative_scale))
        for r in rewards
    )
    return GroupAdvantages(advantages, mean, std, len(scored), zero_spread)


def _scaled(advantage: float, negative_scale: float) -> float:
    return advantage * negative_scale if advantage < 0 else advantage
