"""pass@k, pass rate and mean reward ± SE against values computed by hand."""

from __future__ import annotations

import math

import pytest

from evaluation.metrics import ks_for, mean_and_se, pass_at_k, score


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 0, 1, 0.0),
        (5, 5, 3, 1.0),
        (5, 1, 1, 1 / 5),  # one correct in five draws of one
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 1, 4, 1.0),  # n - c < k: every draw holds the correct one
        (3, 1, 2, 1 - 1 / 3),  # 1 - C(2,2)/C(3,2)
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4), (2, -1, 1)])
def test_pass_at_k_rejects_impossible_inputs(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k needs"):
        pass_at_k(n, c, k)


def test_ks_reported_for_attempts():
    assert ks_for(1) == [1]
    assert ks_for(5) == [1, 2, 4, 5]
    assert ks_for(8) == [1, 2, 4, 8]


def test_mean_and_standard_error():
    mean, se = mean_and_se([1.0, 0.0, 1.0, 0.0])
    # sample variance = 4 * 0.25 / 3 = 1/3; SE = sqrt(1/3 / 4)
    assert mean == 0.5 and se == pytest.approx(math.sqrt(1 / 12))
    assert mean_and_se([0.7]) == (0.7, None)
    assert mean_and_se([]) == (None, None)


def test_errors_are_left_out_not_counted_as_failures():
    rewards = {
        "a": [1.0, 0.0, None],  # n=2, c=1, one error
        "b": [1.0, 1.0, 1.0],  # n=3, c=3
        "c": [None, None, None],  # nothing scored
    }
    s = score(rewards, ks=[1, 2, 3])
    assert (s.trials, s.scored, s.passed, s.errors) == (9, 5, 4, 4)
    assert s.pass_rate == pytest.approx(4 / 5)  # an error would make it 4/9 if counted as failure
    assert s.mean_reward == pytest.approx(4 / 5)
    # pass@1: mean of a: 1/2, b: 1 -> 0.75; pass@2: a: 1 - C(1,2)/C(2,2) = 1, b: 1 -> 1.0
    assert s.pass_at_k["1"] == pytest.approx(0.75)
    assert s.pass_at_k["2"] == pytest.approx(1.0)
    # pass@3: only b has three scored trials
    assert s.pass_at_k["3"] == 1.0 and s.pass_at_k_tasks == {"1": 2, "2": 2, "3": 1}


def test_partial_rewards_pass_at_the_threshold():
    s = score({"t": [0.5, 1.0, 1.4]}, ks=[1], threshold=1.0)
    assert s.passed == 2 and s.mean_reward == pytest.approx(2.9 / 3)
    assert score({"t": [None]}, ks=[1]).pass_rate is None
