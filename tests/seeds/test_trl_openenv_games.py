"""The TRL guide's Wordle and multi-environment blocks (SOURCES.md) run here, and do what the guide says.

Each seed differs from its guide block only where guide_diff's rules and the three below allow: the
guide's colocated vLLM cannot run on a CPU (and the guide's settings refuse it with one line), its
settings get smaller, and the multi-environment block's elided bodies are filled with our own code. The
environments are the offline stand-ins (offline/textarena_env, offline/openspiel_env), real TextArena and
OpenSpiel games behind the shape of OpenEnv's clients.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import re
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.seeds.guide_diff import HERE, Rule, changes, refused_changes, run_seed, seed_functions

OFFLINE = HERE / "offline"

# -- the rules of these seeds ------------------------------------------------------------------------

COLOCATE_LINES = ("        use_vllm=True,", '        vllm_mode="colocate",')


def colocated_vllm_dropped(guide: str | None, ours: str | None) -> bool:
    """The guide's two lines that colocate vLLM in the training process (a GPU's); the embedded engine
    serves the model instead. Without them the config is accepted; with them it is refused in one line
    (test_the_guides_colocated_config_is_refused_in_one_line)."""
    return ours is None and guide in COLOCATE_LINES


SHORTER = ("max_completion_length", "num_generations", "per_device_train_batch_size",
           "gradient_accumulation_steps", "max_steps")  # fmt: skip
_SETTING = re.compile(rf"(\s*)({'|'.join(SHORTER)})=(\d+),")


def shorter_setting(guide: str | None, ours: str | None) -> bool:
    """One of the guide's own length and batch settings, smaller (a short run for CI)."""
    a, b = _SETTING.fullmatch(guide or ""), _SETTING.fullmatch(ours or "")
    return bool(a and b) and a[1] == b[1] and a[2] == b[2] and 0 < int(b[3]) < int(a[3])


_PER_ENV = re.compile(r"n = (\d+)")


def fewer_rows_per_environment(guide: str | None, ours: str | None) -> bool:
    """The dataset block's rows per environment (`n = 500`), fewer."""
    a, b = _PER_ENV.fullmatch(guide or ""), _PER_ENV.fullmatch(ours or "")
    return bool(a and b) and 0 < int(b[1]) < int(a[1])


WORDLE_TRAIN_RULES: tuple[Rule, ...] = (colocated_vllm_dropped, shorter_setting)
MULTI_ENV_RULES: tuple[Rule, ...] = (fewer_rows_per_environment,)


@pytest.mark.parametrize(
    ("name", "rules"),
    [
        ("trl_openenv_wordle_env", ()),
        ("trl_openenv_wordle_reopen", ()),
        ("trl_openenv_wordle_train", WORDLE_TRAIN_RULES),
        ("trl_openenv_multi_env", MULTI_ENV_RULES),
    ],
)
def test_a_seed_differs_from_its_guide_only_where_the_rules_allow(name, rules) -> None:
    refused = refused_changes(name, extra=rules, fill_elisions=name == "trl_openenv_multi_env")
    assert not refused, f"{name}.py changes the guide beyond what its rules allow: {refused}"


def test_these_rules_refuse_any_other_change() -> None:
    assert not colocated_vllm_dropped("        learning_rate=1e-6,", None)
    assert not colocated_vllm_dropped('        vllm_mode="colocate",', '        vllm_mode="server",')
    assert shorter_setting("        max_steps=150,", "        max_steps=1,")
    assert not shorter_setting("        max_steps=150,", "        max_steps=300,")
    assert not shorter_setting("        max_steps=150,", "        num_generations=1,")
    assert not shorter_setting("        learning_rate=1,", "        learning_rate=0,")
    assert fewer_rows_per_environment("n = 500", "n = 1")
    assert not fewer_rows_per_environment("n = 500", "n = 0")
    guide = 'class A:\n    def stay(self) -> str:\n        """Stay. ..."""\n        ...\n\nn = 5\n'
    filled = 'class A:\n    def stay(self) -> str:\n        """Stay."""\n        return "ok"\n\nn = 5\n'
    assert changes(guide, filled, fill_elisions=True) == []  # the elided lines may be filled
    assert changes(guide, filled) != []
    rewritten = filled.replace("    def stay(self) -> str:", "    def stay(self, x: int) -> str:")
    assert (  # a line the guide writes stays
        "    def stay(self) -> str:",
        "    def stay(self, x: int) -> str:",
    ) in changes(guide, rewritten, fill_elisions=True)
    assert changes(guide, filled + "extra = 1\n", fill_elisions=True) == [(None, "extra = 1")]


def test_the_guides_colocated_config_is_refused_in_one_line() -> None:
    """The guide's GRPOConfig(...) arguments, read from the verbatim block, as TRL's script passes them."""
    from harbor_rl import GRPOConfig
    from trainer.errors import TrainerConfigError

    tree = ast.parse((HERE / "guide" / "trl_openenv_wordle_train.py").read_text())
    (call,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "GRPOConfig"
    ]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert kwargs["vllm_mode"] == "colocate" and kwargs["use_vllm"] is True
    with pytest.raises(TrainerConfigError) as refused:
        GRPOConfig(**kwargs)
    message = str(refused.value)
    assert "\n" not in message
    assert "vllm_mode='colocate' is not supported here" in message
    assert "start `vllm serve` (or `harbor engine`) and set vllm_server_base_url" in message
    config = GRPOConfig(**{k: v for k, v in kwargs.items() if k not in ("use_vllm", "vllm_mode")})
    assert config.importance_sampling_mode == "token_truncate" and config.max_tool_calling_iterations == 12


# -- the stand-ins and the verbatim classes --------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch):
    """The stand-ins importable as the guide imports them; Wordle's secret known, Catch's ball repeatable."""
    monkeypatch.syspath_prepend(str(OFFLINE))
    import openspiel_env
    import textarena_env.server

    monkeypatch.setattr(textarena_env.server, "WORDS", ("crane",))
    monkeypatch.setattr(openspiel_env, "SEED", 3)  # the ball starts above the paddle: staying catches it
    return SimpleNamespace(textarena=textarena_env, openspiel=openspiel_env)


def seed_module(name: str) -> Any:
    """A seed as a module (its stand-ins on the path: the `offline` fixture)."""
    sys.modules.pop(f"tests.seeds.{name}", None)
    return importlib.import_module(f"tests.seeds.{name}")


FEEDBACK = re.compile(r"Feedback:\n([A-Z ]+)\n([GYX ]+)")


def test_wordle_env_trims_textarenas_cumulative_feedback_and_keeps_what_the_rewards_need(offline) -> None:
    env = seed_module("trl_openenv_wordle_env").WordleEnv()
    first = env.reset()
    assert first.startswith("\n[GAME] You are Playing Wordle.") and "Enter your guess to begin." in first

    slate = env.guess("[slate]")
    assert slate == (
        "\n[GAME] [slate]\n[GAME] You submitted [slate].\nFeedback:\nS L A T E\nX X G X G\nYou have 5 guesses left."
    )  # only what this guess added: TextArena's own text, as its Wordle prints it
    assert FEEDBACK.search(slate).groups() == ("S L A T E", "X X G X G")
    assert (env.num_guesses, env.best_greens, env.invalid_moves, env.done) == (1, 2, 0, False)

    invalid = env.guess("[xyzzy]")
    assert "You attempted an invalid move" in invalid and "'xyzzy' is not an English word" in invalid
    assert "S L A T E" not in invalid  # trimmed
    assert (env.num_guesses, env.invalid_moves) == (1, 1)

    env.guess("[crane]")
    assert env.done and env.won and env.num_guesses == 2
    rewards = seed_functions("trl_openenv_wordle_train")
    assert rewards["reward_win"]([env]) == [pytest.approx(1.0 + 0.5 * (1 - 2 / 6))]
    assert rewards["reward_partial"]([env]) == [0.0] and rewards["reward_invalid"]([env]) == [-0.1]
    with pytest.raises(ValueError, match="^Game over.$"):
        env.guess("[slate]")

    assert env.reset().count("You are Playing Wordle.") == 1  # a new game, the old history gone
    assert (env.done, env.won, env.num_guesses, env.best_greens, env.invalid_moves) == (False, False, 0, 0, 0)


def test_the_guess_tool_is_found_from_its_docstring(offline) -> None:
    from harnesses.env_factory import EnvironmentFactory

    (tool,) = EnvironmentFactory(seed_module("trl_openenv_wordle_env").WordleEnv).tool_schemas
    assert tool == {
        "type": "function",
        "function": {
            "name": "guess",
            "description": "Make a guess in the Wordle environment.",
            "parameters": {
                "type": "object",
                "properties": {
                    "guess": {"type": "string", "description": "The guessed word, formatted as '[abcde]'"}
                },
                "required": ["guess"],
            },
        },
    }


class ScriptedClient:
    """An AsyncOpenAI stand-in whose replies are tool calls given in advance, one reply per model call."""

    def __init__(self, replies: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **request: Any) -> Any:
        self.requests.append(request)
        calls = self.replies.pop(0) if self.replies else []
        tool_calls = [
            SimpleNamespace(id=f"call-{i}", function=SimpleNamespace(name=name, arguments=json.dumps(args)))
            for i, (name, args) in enumerate(calls)
        ]
        message = SimpleNamespace(content="", tool_calls=tool_calls or None)
        return SimpleNamespace(
            choices=[SimpleNamespace(message=message)], usage=SimpleNamespace(completion_tokens=8)
        )


def episode(env_class: type, replies: list, row: dict[str, Any]) -> tuple[Any, Any, ScriptedClient]:
    """One episode of our env-factory loop (the one GRPOTrainer runs) with the scripted model."""
    from harnesses.env_factory import EnvironmentFactory, LoopConfig, run_episode

    factory = EnvironmentFactory(env_class)
    env, client = factory.create(), ScriptedClient(replies)
    config = LoopConfig(max_tool_calling_iterations=12, max_completion_length=4096)
    result = asyncio.run(
        run_episode(factory, env, client, model="m", prompt=row["prompt"], row=row, config=config)  # type: ignore[arg-type]
    )
    return result, env, client


def test_a_guess_after_game_over_goes_back_to_the_model_as_the_tool_response_and_counts_as_a_failure(
    offline,
) -> None:
    WordleEnv = seed_module("trl_openenv_wordle_env").WordleEnv
    row = {"prompt": [{"role": "user", "content": "Use the tool `guess` to make a guess."}]}
    # One turn with two calls: the first wins, the second comes after the game is over.
    result, env, client = episode(
        WordleEnv, [[("guess", {"guess": "[crane]"}), ("guess", {"guess": "[slate]"})]], row
    )
    assert env.won and [call.failed for call in result.tool_calls] == [False, True]
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert tool_messages[1]["content"] == "Error: ValueError: Game over."
    assert result.tool_failures_by_name == {"guess": 1}  # what tools/failure_frequency counts
    assert client.requests[0]["messages"][0]["content"].startswith(
        "Use the tool `guess` to make a guess.\n\n\n[GAME] You are Playing Wordle."
    )  # reset()'s observation joins the prompt


def test_the_reopening_reset_fragment_closes_the_client_and_plays_on_a_fresh_one(offline) -> None:
    """The fragment as written: a reset() whose `...` is the rest of the guide's reset (so it returns None)."""
    fragment = seed_module("trl_openenv_wordle_reopen")
    holder = SimpleNamespace(client=offline.textarena.TextArenaEnv(base_url=fragment.env_url))
    old = holder.client
    old.reset()
    old.step(offline.textarena.TextArenaAction(message="[slate]"))
    assert fragment.reset(holder) is None
    assert old.session is None  # closed: its server session is released
    assert holder.client is not old and holder.client.session is not None
    state = holder.client.state()
    assert state.step_count == 0 and state.episode_id is not None  # a new game, reset by the fragment


def test_multi_env_offers_every_tool_routes_by_the_env_column_and_scores_only_its_own_rows(offline) -> None:
    from harnesses.env_factory import EnvironmentFactory

    seed = seed_module("trl_openenv_multi_env")
    assert set(EnvironmentFactory(seed.MultiEnv).tools) == {"guess", "move", "stay"}
    rows = list(seed.dataset)
    assert [row["env"] for row in rows] == ["wordle", "catch"]

    wordle, wordle_env, _ = episode(
        seed.MultiEnv, [[("move", {"direction": "left"})], [("guess", {"guess": "[crane]"})]], rows[0]
    )
    assert wordle_env.active == "wordle"
    assert "You are Playing Wordle." in wordle.messages[0]["content"]  # reset(env="wordle")
    tool_messages = [m["content"] for m in wordle.messages if m["role"] == "tool"]
    assert tool_messages[0] == "Error: ValueError: this tool plays Catch; the game now is wordle"  # wrong env
    assert wordle_env.reward == 1.0 and wordle_env.done and wordle.stop_reason == "env_done"

    catch, catch_env, _ = episode(seed.MultiEnv, [[("stay", {})]] * 9, rows[1])
    assert catch_env.active == "catch"
    assert "Ball: row 1 of 10, column 3 of 5, above the paddle." in catch.messages[0]["content"]  # reset
    assert catch_env.done and catch_env.reward == 1.0 and len(catch.tool_calls) == 9

    both = [wordle_env, catch_env]
    assert seed.wordle_reward(both) == [1.0, None] and seed.catch_reward(both) == [None, 1.0]

    env = seed.MultiEnv()
    assert env._wordle_client is None and env._catch_client is None  # clients made lazily, in reset()
    env.reset(env="wordle")
    first = env._wordle_client
    env.reset(env="wordle")
    assert first.session is None and env._wordle_client is not first  # closed before reopening


# -- training runs -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_wordle_block_trains_and_logs_each_reward_term(tmp_path) -> None:
    done = run_seed("trl_openenv_wordle_train", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "trainer_output"
    (step,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["rollout/scoreable"] == 2 and step["rollout/failed"] == 0
    terms = [step[f"rewards/{name}/mean"] for name in ("reward_win", "reward_partial", "reward_invalid")]
    assert step["reward"] == pytest.approx(sum(terms))  # TRL logs each term; the reward is their sum

    from capture_proxy.store import TraceStore

    store = TraceStore(f"sqlite:///{out / 'traces.db'}")
    try:
        request = next(t.request for s in store.list_sessions() for t in store.get_turns(s.session_id))
    finally:
        store.close()
    assert [tool["function"]["name"] for tool in request["tools"]] == ["guess"]
    user = request["messages"][-1]["content"]
    assert user.startswith("You are an expert Wordle solver") and "[GAME] You are Playing Wordle." in user


@pytest.fixture(scope="module")
def stayer(tmp_path_factory) -> str:
    """A model that answers every turn with a call of `stay` (tests/engine/scripted_model.py)."""
    from engine.tiny_model import build_tiny_model
    from tests.engine.scripted_model import build_scripted_model

    text = 'Sure.<tool_call>{"name": "stay"}</tool_call>'
    return str(build_scripted_model(build_tiny_model(seed=0), tmp_path_factory.mktemp("stayer"), text))


@pytest.mark.slow
def test_multi_env_training_averages_each_reward_over_its_own_environments_rows(
    offline, stayer, tmp_path
) -> None:
    """The guide's three blocks under our GRPOTrainer, with the script's reward functions in order (a model
    that always stays: Catch rows catch the ball, Wordle rows call the wrong env's tool)."""
    from harbor_rl import GRPOConfig, GRPOTrainer

    seed = seed_module("trl_openenv_multi_env")
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), report_to="jsonl", log_completions=True, max_steps=1,
        num_generations=2, per_device_train_batch_size=4, max_concurrent_rollouts=4, shuffle_dataset=False,
        max_tool_calling_iterations=10, max_completion_length=512,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=stayer, reward_funcs=[seed.wordle_reward, seed.catch_reward], train_dataset=seed.dataset,
        args=args, environment_factory=seed.MultiEnv,
    )  # fmt: skip
    trainer.train()

    (step,) = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert step["rollout/scoreable"] == 4
    assert step["rewards/catch_reward/mean"] == 1.0  # the two catch rows only: None is left out, not 0
    assert step["rewards/wordle_reward/mean"] == 0.0  # the two wordle rows only
    assert step["reward"] == 0.5  # each rollout's total is its own env's function
    assert step["tools/stay/call_total"] == 2 * 9 + 2 * 10  # catch: 9 steps to the bottom; wordle: 10 rounds
    assert step["tools/stay/failure_total"] == 20  # "this tool plays Catch", back to the model
    assert step["tools/failure_frequency"] == pytest.approx(20 / 38)
