"""Reward functions over environments: None for samples a function does not score, routing by a
dataset column, nan-aware totals and means, and the checks on what functions return."""

from __future__ import annotations

import math

import pytest

from harnesses.env_factory import RewardFunctionError, combine_rewards, compute_rewards, route_by_column
from harnesses.env_factory.rewards import env_attribute


class Env:
    def __init__(self, active: str, reward: float | None) -> None:
        self.active, self.reward = active, reward


def wordle_reward(environments, **kwargs):
    return [env.reward if env.active == "wordle" else None for env in environments]


def catch_reward(environments, **kwargs):
    return [max(env.reward, 0.0) if env.active == "catch" else None for env in environments]


def bonus(environments, **kwargs):
    return [0.5 for _ in environments]


ENVS = [Env("wordle", 1.0), Env("catch", -1.0), Env("wordle", 0.2), Env("other", 3.0)]


def test_none_means_not_scored_and_totals_are_nansums():
    table = compute_rewards([wordle_reward, catch_reward], ENVS)
    assert table.names == ["wordle_reward", "catch_reward"]
    assert math.isnan(table.values[0, 1]) and table.values[1, 1] == 0.0
    assert table.totals() == [1.0, 0.0, 0.2, None]  # the 'other' sample: no function scored it
    assert table.means() == {"wordle_reward": pytest.approx(0.6), "catch_reward": 0.0}
    assert table.row(0) == {"wordle_reward": 1.0}


def test_weights_apply_to_scored_values_only():
    totals = combine_rewards([wordle_reward, bonus], ENVS, weights=[2.0, 1.0])
    assert totals == [2.5, 0.5, pytest.approx(0.9), 0.5]


def test_a_function_that_scores_nothing_has_mean_none():
    table = compute_rewards([catch_reward], [Env("wordle", 1.0)])
    assert table.means() == {"catch_reward": None} and table.totals() == [None]


def test_routing_by_a_dataset_column():
    def echo_score(environments, prompt, **kwargs):
        # Routed functions see only their own samples, and the columns sliced to match.
        assert len(prompt) == len(environments)
        return [len(p) / 10 for p in prompt]

    routed = route_by_column("env", {"wordle": wordle_reward, "echo": echo_score})
    envs = [Env("wordle", 1.0), Env("echo", 0.0), Env("catch", 0.0)]
    kwargs = {"env": ["wordle", "echo", "catch"], "prompt": ["a", "hello", "zz"]}
    assert routed(envs, **kwargs) == [1.0, 0.5, None]
    assert combine_rewards([routed], envs, **kwargs) == [1.0, 0.5, None]
    with pytest.raises(RewardFunctionError, match="no such column"):
        routed(envs, prompt=kwargs["prompt"])


def test_env_attribute_reads_the_instance():
    assert env_attribute("reward")(ENVS[:2]) == [1.0, -1.0]
    assert env_attribute("missing")(ENVS[:1]) == [None]


def test_bad_reward_function_outputs_are_errors_naming_the_function():
    with pytest.raises(RewardFunctionError, match="'short' returned 1 values for 2 samples"):

        def short(environments, **kwargs):
            return [1.0]

        compute_rewards([short], ENVS[:2])

    def text(environments, **kwargs):
        return ["high" for _ in environments]

    with pytest.raises(RewardFunctionError, match="'text': sample 0 is 'high'"):
        compute_rewards([text], ENVS[:1])

    def flag(environments, **kwargs):
        return [True for _ in environments]

    with pytest.raises(RewardFunctionError, match="not a number"):
        compute_rewards([flag], ENVS[:1])
    with pytest.raises(RewardFunctionError, match="1 reward weights for 2"):
        compute_rewards([bonus, bonus], ENVS, weights=[1.0])
