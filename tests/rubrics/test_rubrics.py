"""Rubric semantics: child registration, named_rubrics, last_score, hooks, state_dict, sync and async
forward, the containers, trajectory credit assignment, and transforms."""

from __future__ import annotations

import asyncio

import pytest

from tasks.rubrics import (
    Compose,
    ExponentialDiscountingTrajectoryRubric,
    FunctionTransform,
    Gate,
    Rubric,
    RubricCallError,
    RubricConfigError,
    RubricDict,
    RubricList,
    Sequential,
    TrajectoryRubric,
    TruncateText,
    WeightedSum,
)


class Fixed(Rubric):
    _state_keys = ("value",)

    def __init__(self, value: float | None) -> None:
        super().__init__()
        self.value = value

    def forward(self, action, observation):
        return self.value


class Length(Rubric):
    def forward(self, action, observation):
        return min(1.0, len(action) / 10)


class AsyncFixed(Rubric):
    def __init__(self, value: float, delay: float = 0.0) -> None:
        super().__init__()
        self.value, self.delay = value, delay

    async def forward(self, action, observation):
        await asyncio.sleep(self.delay)
        return self.value


class Code(Rubric):
    def __init__(self) -> None:
        super().__init__()
        self.syntax = Fixed(1.0)
        self.tests = Fixed(0.5)
        self.weight = 0.3  # a plain attribute: not a child

    def forward(self, action, observation):
        return self.weight * self.syntax(action, observation) + 0.7 * self.tests(action, observation)


def test_children_register_by_attribute_assignment_and_scores_stay_visible():
    rubric = Code()
    assert [name for name, _ in rubric.named_children()] == ["syntax", "tests"]
    assert rubric.last_score is None
    assert rubric("x", None) == pytest.approx(0.65)
    assert rubric.last_score == pytest.approx(0.65)
    assert {name: r.last_score for name, r in rubric.named_rubrics()} == {"syntax": 1.0, "tests": 0.5}
    # Reassigning a child to a non-rubric unregisters it; deleting does too.
    rubric.tests = 3
    assert [name for name, _ in rubric.named_children()] == ["syntax"]
    del rubric.syntax
    assert list(rubric.named_children()) == []


def test_named_rubrics_walks_nested_children_with_dotted_paths():
    outer = Sequential(Code(), Gate(Length(), threshold=0.5))
    names = [name for name, _ in outer.named_rubrics()]
    assert names == ["rubric_0", "rubric_0.syntax", "rubric_0.tests", "rubric_1", "rubric_1.rubric"]
    assert isinstance(outer.get_rubric("rubric_1.rubric"), Length)
    with pytest.raises(KeyError, match="nope"):
        outer.get_rubric("rubric_0.nope")


def test_assigning_before_super_init_is_a_clear_error():
    class Broken(Rubric):
        def __init__(self):
            self.child = Fixed(1.0)

    with pytest.raises(RubricConfigError, match="super\\(\\).__init__"):
        Broken()


def test_forward_hooks_see_every_call_and_can_be_removed():
    rubric = Length()
    seen, pre = [], []
    handle = rubric.register_forward_hook(lambda r, a, o, score: seen.append((a, score)))
    rubric.register_forward_pre_hook(lambda r, a, o: pre.append((a, r.last_score)))
    rubric("abcde", None)
    rubric("abcdefghij", None)
    assert seen == [("abcde", 0.5), ("abcdefghij", 1.0)]
    assert pre == [("abcde", None), ("abcdefghij", 0.5)]  # pre-hooks run before last_score updates
    handle.remove()
    rubric("a", None)
    assert len(seen) == 2 and rubric.last_score == 0.1


def test_forward_results_are_checked():
    with pytest.raises(RubricCallError, match="expected a float"):
        Fixed("1.0")("a", None)  # type: ignore[arg-type]
    with pytest.raises(RubricCallError, match="finite"):
        Fixed(float("nan"))("a", None)
    assert Fixed(None)("a", None) is None  # unscoreable stays None


def test_state_dict_round_trips_configuration_and_last_scores():
    rubric = WeightedSum([Fixed(1.0), Fixed(0.0)], weights=[0.25, 0.75])
    rubric("a", None)
    state = rubric.state_dict()
    assert state == {
        "last_score": 0.25,
        "weights": [0.25, 0.75],
        "rubric_0.last_score": 1.0,
        "rubric_0.value": 1.0,
        "rubric_1.last_score": 0.0,
        "rubric_1.value": 0.0,
    }
    fresh = WeightedSum([Fixed(0.0), Fixed(0.0)], weights=[0.5, 0.5])
    fresh.load_state_dict(state)
    assert fresh.weights == [0.25, 0.75] and fresh("a", None) == 0.25
    with pytest.raises(RubricConfigError, match="unknown keys \\['bogus'\\]"):
        fresh.load_state_dict({**state, "bogus": 1})


async def test_async_forward_returns_a_coroutine_and_records_last_score():
    rubric = AsyncFixed(0.7)
    assert rubric.is_async
    pending = rubric("a", None)
    assert asyncio.iscoroutine(pending)
    assert await pending == 0.7 and rubric.last_score == 0.7


async def test_async_hooks_are_awaited_on_the_async_path():
    rubric = AsyncFixed(0.4)
    seen = []

    async def hook(r, a, o, score):
        seen.append(score)

    rubric.register_forward_hook(hook)
    await rubric("a", None)
    assert seen == [0.4]
    sync = Length()
    sync.register_forward_hook(hook)
    with pytest.raises(RubricCallError, match="awaitable"):
        sync("a", None)


async def test_weighted_sum_runs_async_children_concurrently():
    rubric = WeightedSum([AsyncFixed(1.0, 0.2), AsyncFixed(0.0, 0.2), Fixed(0.5)], weights=[0.5, 0.25, 0.25])
    assert rubric.is_async
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await rubric("a", None) == pytest.approx(0.625)
    assert loop.time() - started < 0.35  # two 0.2 s children overlapped
    assert [r.last_score for r in rubric.rubrics()] == [1.0, 0.0, 0.5]


def test_weighted_sum_validates_weights_and_propagates_none():
    with pytest.raises(RubricConfigError, match="sum to 1.0"):
        WeightedSum([Fixed(1.0)], weights=[0.5])
    with pytest.raises(RubricConfigError, match="2 rubrics but 1 weights"):
        WeightedSum([Fixed(1.0), Fixed(1.0)], weights=[1.0])
    assert WeightedSum([Fixed(None), Fixed(1.0)], weights=[0.5, 0.5])("a", None) is None


def test_sequential_stops_at_the_first_zero():
    later = Fixed(0.9)
    assert Sequential(Fixed(0.5), Fixed(0.0), later)("a", None) == 0.0
    assert later.last_score is None  # never ran
    assert Sequential(Fixed(0.5), later)("a", None) == 0.9
    assert Sequential()("a", None) == 1.0


async def test_sequential_and_gate_with_async_children():
    assert await Sequential(AsyncFixed(0.5), Fixed(0.8))("a", None) == 0.8
    assert await Gate(AsyncFixed(0.4), threshold=0.5)("a", None) == 0.0
    assert await Gate(AsyncFixed(0.6), threshold=0.5)("a", None) == 0.6


def test_gate_passes_scores_at_or_above_threshold():
    assert Gate(Length(), threshold=0.5)("abcd", None) == 0.0
    assert Gate(Length(), threshold=0.5)("abcde", None) == 0.5
    assert Gate(Fixed(None))("a", None) is None


def test_rubric_list_and_dict_register_members_but_do_not_score():
    members = RubricList([Fixed(1.0), Length()])
    members.append(Fixed(0.2))
    assert len(members) == 3 and [n for n, _ in members.named_rubrics()] == ["0", "1", "2"]
    with pytest.raises(RubricCallError, match="container"):
        members("a", None)
    by_task = RubricDict({"wordle": Fixed(1.0), "echo": Length()})
    assert by_task["echo"]("abc", None) == pytest.approx(0.3)
    assert "wordle" in by_task and by_task.keys() == ["wordle", "echo"]
    with pytest.raises(KeyError, match="no rubric 'catch'"):
        by_task["catch"]
    with pytest.raises(RubricConfigError, match="identifier"):
        by_task["not valid"] = Fixed(1.0)


class WinLoss(ExponentialDiscountingTrajectoryRubric):
    def score_trajectory(self, trajectory):
        return 1.0 if trajectory[-1][1]["won"] else 0.0


def test_trajectory_rubric_returns_intermediate_reward_until_done_then_the_episode_score():
    rubric = WinLoss(gamma=0.5, intermediate_reward=0.1)
    assert rubric("a", {"done": False, "won": False}) == 0.1
    assert rubric("b", {"done": False, "won": False}) == 0.1
    assert rubric("c", {"done": True, "won": True}) == 1.0
    assert rubric.compute_step_rewards() == [0.25, 0.5, 1.0]
    assert [a for a, _ in rubric.trajectory] == ["a", "b", "c"]
    rubric.reset()
    assert rubric.trajectory == [] and rubric.compute_step_rewards() == [] and rubric.last_score is None
    assert rubric.state_dict() == {"last_score": None, "intermediate_reward": 0.1, "gamma": 0.5}


def test_trajectory_rubric_needs_its_scoring_methods():
    class Bare(TrajectoryRubric):
        pass

    with pytest.raises(NotImplementedError, match="score_trajectory"):
        Bare()("a", {"done": True})
    with pytest.raises(RubricConfigError, match="gamma"):
        WinLoss(gamma=1.5)


def test_transforms_compose_in_order():
    shout = FunctionTransform(str.upper)
    cut = TruncateText(max_chars=20, marker="[{n} cut]")
    pipeline = shout >> cut
    assert isinstance(pipeline, Compose) and len(pipeline.transforms) == 2
    assert pipeline("abc") == "ABC"
    long = "x" * 10 + "y" * 30 + "z" * 10
    out = pipeline(long)
    assert out.startswith("X" * 10) and out.endswith("Z" * 10) and "[30 cut]" in out
    assert Compose(pipeline, shout).transforms == [shout, cut, shout]  # nested Compose flattens
    assert cut({"not": "text"}) == {"not": "text"}
