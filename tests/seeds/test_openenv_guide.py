"""OpenEnv's rewards / harness / collect guide (chapter 6), its rubric blocks: they run here as published
(plus, above the block marker, the sub-rubrics the guide leaves undefined) with OpenEnv's own `Rubric`,
and an environment class here scores with them through OpenEnv's hooks. SOURCES.md says where each block
comes from."""

from __future__ import annotations

import contextlib
import io
import runpy

import pytest

from tests.seeds.guide_diff import HERE, refused_changes


def test_the_code_rubric_block_is_the_guide_s_own() -> None:
    assert refused_changes("openenv_code_rubric") == []


def test_sub_rubrics_register_on_assignment_and_report_their_last_score() -> None:
    """6.3: 'assigning a sub-rubric registers it'; `named_rubrics()` with each one's `last_score`
    prints "syntax 1.0" / "tests 0.5"."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        seed = runpy.run_path(str(HERE / "openenv_code_rubric.py"), run_name="openenv_code_rubric")
    assert printed.getvalue() == "syntax 1.0\ntests 0.5\n"
    assert seed["reward"] == pytest.approx(0.3 * 1.0 + 0.7 * 0.5)


def test_an_environment_here_scores_with_the_rubric_through_openenv_s_hook() -> None:
    """6.3 'How environments use Rubric': the author calls `observation.reward = self._apply_rubric(action,
    observation)` in their own step. The guide's fragment (`def step(self, action, ...)`) is not Python as
    written; the same call, in a tool of an environment class here (tasks.environments.Environment):"""
    from harnesses.env_factory.contract import EnvironmentFactory
    from tasks.environments import Environment

    seed = runpy.run_path(str(HERE / "openenv_code_rubric.py"), run_name="openenv_code_rubric")

    class Coding(Environment):
        def __init__(self):
            super().__init__(rubric=seed["CodeRubric"]())

        def submit(self, code: str) -> str:
            """Submit code to be scored.

            Args:
                code: The program
            """
            observation = {"passed": 1, "total": 2}
            self.reward = self._apply_rubric(code, observation)
            return f"{observation['passed']}/{observation['total']} tests pass"

    factory = EnvironmentFactory(Coding)
    assert list(factory.tools) == ["submit"]  # the hooks are protected: no tool the author did not write
    env = factory.create()
    env.reset()
    assert env.submit("print('hi')") == "1/2 tests pass"
    assert env.reward == pytest.approx(0.65)
    assert {name: r.last_score for name, r in env.rubric.named_rubrics()} == {"syntax": 1.0, "tests": 0.5}
