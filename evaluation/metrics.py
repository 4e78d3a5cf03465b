"""Scores of a set of trials: pass rate, the unbiased pass@k estimator, mean reward with its standard error,
and the mean of every metric a verifier reported.

A trial whose reward is None is left out of the reward's scores, never counted as a failure (reward 0):
an error (the verifier did not run or gave no metrics, a model call failed, the harness broke), or a
trial of several metrics none of which is the reward; the latter's metrics still count in `metric_means`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, Field

DEFAULT_PASS_THRESHOLD = 1.0
"""A trial passes when its reward is at least this."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k samples drawn without replacement from n (c correct) passes.

    The unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k).
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every draw of k holds a correct one
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(attempts: int) -> list[int]:
    """The k reported for `attempts` trials per task: 1, powers of two below, and attempts itself."""
    ks = {1, attempts}
    k = 2
    while k < attempts:
        ks.add(k)
        k *= 2
    return sorted(ks)


def mean_and_se(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and standard error of the mean (sample std, ddof=1); None where undefined."""
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(variance / n)


class TaskScore(BaseModel):
    """One task's trials: n scored (reward not None), c passed, errors left out."""

    task: str
    n: int
    c: int
    errors: int
    mean_reward: float | None = None

    @property
    def pass_rate(self) -> float | None:
        return self.c / self.n if self.n else None


class Scores(BaseModel):
    """A job's headline numbers."""

    trials: int
    scored: int
    passed: int
    errors: int
    pass_rate: float | None
    """passed / scored; None when nothing was scored."""
    mean_reward: float | None
    reward_se: float | None
    """Standard error of mean_reward."""
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    """`"k"` -> mean over tasks with at least k scored trials of the unbiased estimator."""
    pass_at_k_tasks: dict[str, int] = Field(default_factory=dict)
    """`"k"` -> how many tasks entered that mean (tasks with fewer scored trials are left out)."""
    metrics_only: int = 0
    """Trials with metrics but no one reward (several metrics, none chosen): in no score above, and not
    in `errors`."""


class MetricMean(BaseModel):
    """One metric over the trials that report it (a trial that does not is left out, not counted 0)."""

    mean: float
    se: float | None
    n: int


def metric_means(rewards: Iterable[Mapping[str, float]]) -> dict[str, MetricMean]:
    """Per metric key (sorted): mean and standard error over the reward dicts that hold it."""
    values: dict[str, list[float]] = {}
    for reward in rewards:
        for key, value in reward.items():
            values.setdefault(key, []).append(value)
    means = {}
    for key in sorted(values):
        mean, se = mean_and_se(values[key])
        assert mean is not None
        means[key] = MetricMean(mean=mean, se=se, n=len(values[key]))
    return means


def passed(reward: float | None, threshold: float = DEFAULT_PASS_THRESHOLD) -> bool | None:
    """True/False for a scored trial; None for an error (no reward)."""
    return None if reward is None else reward >= threshold


def task_scores(
    rewards_by_task: Mapping[str, Sequence[float | None]], threshold: float = DEFAULT_PASS_THRESHOLD
) -> list[TaskScore]:
    scores = []
    for task, rewards in rewards_by_task.items():
        scored = [r for r in rewards if r is not None]
        scores.append(
            TaskScore(
                task=task,
                n=len(scored),
                c=sum(r >= threshold for r in scored),
                errors=len(rewards) - len(scored),
                mean_reward=mean_and_se(scored)[0],
            )
        )
    return scores


def score(
    rewards_by_task: Mapping[str, Sequence[float | None]],
    ks: Iterable[int],
    threshold: float = DEFAULT_PASS_THRESHOLD,
) -> Scores:
    """Headline scores of trials grouped by task (rewards None = errors)."""
    per_task = task_scores(rewards_by_task, threshold)
    scored = [r for rewards in rewards_by_task.values() for r in rewards if r is not None]
    mean, se = mean_and_se(scored)
    n_passed = sum(t.c for t in per_task)
    at_k: dict[str, float] = {}
    at_k_tasks: dict[str, int] = {}
    for k in ks:
        eligible = [t for t in per_task if t.n >= k]
        at_k_tasks[str(k)] = len(eligible)
        if eligible:
            at_k[str(k)] = math.fsum(pass_at_k(t.n, t.c, k) for t in eligible) / len(eligible)
    return Scores(
        trials=sum(len(r) for r in rewards_by_task.values()),
        scored=len(scored),
        passed=n_passed,
        errors=sum(t.errors for t in per_task),
        pass_rate=n_passed / len(scored) if scored else None,
        mean_reward=mean,
        reward_se=se,
        pass_at_k=at_k,
        pass_at_k_tasks=at_k_tasks,
    )
