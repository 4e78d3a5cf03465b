"""The built-in environments played directly: the word game's feedback and partial-credit rubric, the
echo rubric, and the coding environment's tools on real sandboxes (local bubblewrap, and Docker)
running a built-in Harbor task, with submit() running that task's real verifier."""

from __future__ import annotations

import pytest

from harnesses.env_factory import EnvironmentFactory, combine_rewards, compute_rewards
from tasks import BUILTIN_DIR, load_task
from tasks.environments import (
    CodingEnv,
    EchoEnv,
    WordleEnv,
    echo_reward,
    echo_shaped_reward,
    wordle_invalid,
    wordle_partial,
    wordle_win,
)
from tasks.environments.wordle import feedback

WORDLE_TERMS = [wordle_win, wordle_partial, wordle_invalid]


def test_wordle_feedback_follows_the_repeated_letter_rule():
    assert feedback("crane", "crane") == "GGGGG"
    assert feedback("nacre", "crane") == "YYYYG"
    assert feedback("geese", "those") == "XXXGG"  # only one yellow/green per secret letter
    assert feedback("speed", "abide") == "XXYXY"


async def test_wordle_win_partial_credit_and_invalid_moves():
    factory = EnvironmentFactory(WordleEnv)
    win, lose = factory.create(), factory.create()
    assert "5-letter word" in await factory.reset(win, {"secret": "crane"})
    await factory.reset(lose, {"secret": "crane"})

    assert (
        await factory.call_tool(win, "guess", {"guess": "slate"}) == "S L A T E\nX X G X G\n5 guesses left."
    )
    with pytest.raises(ValueError, match="invalid guess 'cranes'"):
        await factory.call_tool(win, "guess", {"guess": "cranes"})
    assert (await factory.call_tool(win, "guess", {"guess": "[CRANE]"})).endswith(
        "You found the word in 2 guesses."
    )
    with pytest.raises(ValueError, match="Game over."):
        await factory.call_tool(win, "guess", {"guess": "crane"})
    assert win.won and win.done and win.invalid_moves == 2
    assert win.reward_win == pytest.approx(1.0 + 0.5 * (1 - 2 / 6))

    for word in ["slate", "trace", "house", "plumb", "bumpy", "dizzy"]:
        await factory.call_tool(lose, "guess", {"guess": word})
    assert lose.done and not lose.won
    assert feedback("trace", "crane") == "XGGYG"  # the best guess: 3 greens, 1 yellow
    assert lose.reward_partial == pytest.approx((3 + 0.5 * 1) / 5)
    # The rubric's trajectory holds every valid guess, with discounted step credit for the final score.
    assert len(lose.rubric.trajectory) == 6
    steps = lose.rubric.compute_step_rewards()
    assert steps[-1] == pytest.approx(lose.reward_partial) and steps[0] < steps[-1]

    table = compute_rewards(WORDLE_TERMS, [win, lose])
    assert table.totals() == [
        pytest.approx(win.reward_win - 0.2),
        pytest.approx(lose.reward_partial),
    ]
    assert [env.reward for env in (win, lose)] == table.totals()


async def test_echo_rubric_gives_partial_credit_and_routes_none_to_other_envs():
    factory = EnvironmentFactory(EchoEnv)
    env = factory.create()
    await factory.reset(env, {"target": "Hello World!"})
    assert await factory.call_tool(env, "echo", {"message": "Hello"}) == "Hello"
    partial = env.reward
    assert 0 < partial < 0.5 and not env.done
    await factory.call_tool(env, "echo", {"message": "Hello World!"})
    assert env.reward == 1.0 and env.done
    assert {name: r.last_score for name, r in env.rubric.named_rubrics()} == {
        "rubric_0": 1.0,
        "rubric_1": 1.0,
    }
    other = WordleEnv()
    assert combine_rewards([echo_reward, wordle_win], [env, other]) == [1.0, 0.0]
    assert echo_reward([other]) == [None]


async def test_echo_shaped_reward_gives_plain_text_half_credit():
    factory = EnvironmentFactory(EchoEnv)
    silent, echoed = factory.create(), factory.create()
    for env in (silent, echoed):
        await factory.reset(env, {"target": "Hi!"})
    await factory.call_tool(echoed, "echo", {"message": "Hi!"})
    said_hi = [{"role": "assistant", "content": "Hi"}]
    called = [{"role": "assistant", "content": ""}, {"role": "tool", "content": "Hi!"}]
    # "Hi" vs "Hi!": not exact (0), similarity 2*2/5 = 0.8, so the rubric gives 0.4 and text earns half.
    assert echo_shaped_reward([silent, echoed, WordleEnv()], completions=[said_hi, called, []]) == [
        pytest.approx(0.2),
        1.0,
        None,
    ]
    with pytest.raises(ValueError, match="needs the `completions` column"):
        echo_shaped_reward([silent])


@pytest.fixture
async def task_sandbox(backend):
    """A built-in task's sandbox on each backend (local always; docker where the engine runs)."""
    task = load_task(BUILTIN_DIR / "wordcount-cli")
    sandbox = await backend.start(task.sandbox_spec("coding-env-test", proxy_port=9))
    try:
        yield task, sandbox
    finally:
        await sandbox.stop()


async def test_coding_environment_tools_act_on_the_task_sandbox(task_sandbox):
    task, sandbox = task_sandbox
    factory = EnvironmentFactory(CodingEnv)
    env = factory.create()
    intro = await factory.reset(env, {"sandbox": sandbox, "workdir": "/app", "task": task, "seed": 1})
    assert "/app" in intro
    assert (await factory.call_tool(env, "write_file", {"path": "notes/a.txt", "content": "héllo\n"})) == (
        "wrote 7 bytes to /app/notes/a.txt"
    )
    assert await factory.call_tool(env, "read_file", {"path": "/app/notes/a.txt"}) == "héllo\n"
    out = await factory.call_tool(env, "bash", {"command": "pwd; cat notes/a.txt; ls"})
    assert out.startswith("exit code 0\n/app\nhéllo\n") and "sample.txt" in out
    assert (await factory.call_tool(env, "bash", {"command": "exit 3"})).startswith("exit code 3")
    with pytest.raises(FileNotFoundError):
        await factory.call_tool(env, "read_file", {"path": "missing.txt"})
    reply = await factory.call_tool(env, "submit", {})
    assert reply == "Submitted. Test reward: 0.0"  # the real verifier: nothing was implemented
    assert env.done and env.reward == 0.0
    with pytest.raises(RuntimeError, match="already submitted"):
        await factory.call_tool(env, "bash", {"command": "ls"})


async def test_coding_environment_needs_a_sandbox():
    factory = EnvironmentFactory(CodingEnv)
    with pytest.raises(ValueError, match="needs the task's running sandbox"):
        await factory.reset(factory.create(), {"workdir": "/app"})


async def test_the_trl_guides_wordle_reward_functions_run_on_it_unchanged():
    """TRL's OpenEnv guide (the Wordle section) scores its WordleEnv with three functions; they run, as the
    guide's seed has them (tests/seeds), on ours, which has the attributes they read and the tool argument
    its prompt asks for (`guess`)."""
    from tests.seeds.guide_diff import seed_functions

    guide = seed_functions("trl_openenv_wordle_train")
    reward_win, reward_partial, reward_invalid = (
        guide[n] for n in ("reward_win", "reward_partial", "reward_invalid")
    )

    factory = EnvironmentFactory(WordleEnv)
    win, lose = factory.create(), factory.create()
    for env in (win, lose):
        await factory.reset(env, {"secret": "crane"})
    for word in ("slate", "[crane]"):
        await factory.call_tool(win, "guess", {"guess": word})
    await factory.call_tool(lose, "guess", {"guess": "plant"})
    with pytest.raises(ValueError, match="invalid guess"):
        await factory.call_tool(lose, "guess", {"guess": "xx"})
    assert list(factory.tools["guess"].schema["function"]["parameters"]["properties"]) == ["guess"]
    table = compute_rewards([reward_win, reward_partial, reward_invalid], [win, lose])
    assert table.row(0) == {"reward_win": pytest.approx(1 + 0.5 * (1 - 2 / 6)), "reward_partial": 0.0,
                            "reward_invalid": 0.0}  # fmt: skip
    assert table.row(1) == {
        "reward_win": 0.0,
        "reward_partial": pytest.approx(0.2),
        "reward_invalid": pytest.approx(-0.1),
    }
