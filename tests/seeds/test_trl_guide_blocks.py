"""TRL's OpenEnv guide, the blocks that define an environment, a reward or a setting rather than run a
training: each runs here as published (plus, above the block marker, what the guide defines elsewhere) and
does what the guide says. SOURCES.md says where each block comes from."""

from __future__ import annotations

import asyncio
import runpy

import pytest

from harnesses.env_factory.contract import EnvironmentFactory
from tests.seeds.guide_diff import HERE, refused_changes

BLOCKS = [
    "trl_openenv_my_env",
    "trl_openenv_reward_func",
    "trl_openenv_max_completion_length",
    "trl_openenv_space_client",
    "trl_openenv_concurrency",
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from engine.tiny_model import build_tiny_model

    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.fixture
def offline(monkeypatch):
    """The offline stand-ins importable, as `run_seed` makes them."""
    monkeypatch.syspath_prepend(str(HERE / "offline"))


def run_block(name: str) -> dict:
    return runpy.run_path(str(HERE / f"{name}.py"), run_name=name)


@pytest.mark.parametrize("name", BLOCKS)
def test_each_block_is_the_guide_s_own(name) -> None:
    assert refused_changes(name) == []


def test_the_environment_template_s_tool_comes_from_its_signature_and_docstring() -> None:
    """'Every public method other than reset is a tool; its docstring with Args: builds the schema.'"""
    seed = run_block("trl_openenv_my_env")
    factory = EnvironmentFactory(seed["MyEnv"])
    (schema,) = factory.tool_schemas
    assert schema["function"]["name"] == "my_tool"
    assert schema["function"]["description"] == "Description of what this tool does."
    assert schema["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "arg1": {"type": "string", "description": "Description of arg1"},
            "arg2": {"type": "integer", "description": "Description of arg2"},
        },
        "required": ["arg1", "arg2"],
    }
    env = factory.create()
    assert env.client.base_url == seed["ENV_URL"]  # the URL captured from the enclosing scope

    async def episode() -> tuple[str | None, str]:
        first = await factory.reset(env, {"prompt": "p", "level": 3})  # every column, as keywords
        return first, await factory.call_tool(env, "my_tool", '{"arg1": "a", "arg2": 2}')

    assert asyncio.run(episode()) == ("Initial observation for the model", "Tool result")
    # 'Reward functions read the state stored on the instance': the guide's reward_func over two episodes.
    reward_func = run_block("trl_openenv_reward_func")["reward_func"]
    untouched = factory.create()
    assert reward_func([env, untouched], prompts=["p", "p"]) == [1.0, 0.0]


def test_max_completion_length_is_the_budget_of_the_whole_conversation() -> None:
    args = run_block("trl_openenv_max_completion_length")["args"]
    loop = args.loop()
    assert loop.max_completion_length == 4096  # every turn's completion tokens together, as in TRL
    assert loop.max_tokens_per_turn is None  # no cap on a single call unless asked


def test_the_space_client_line_builds_a_client(offline) -> None:
    env = run_block("trl_openenv_space_client")["env"]
    from echo_env.models import EchoAction

    result = env.step(EchoAction(message="Hello World!"))
    assert result.observation.echoed_message == "Hello World!"
    assert result.observation.reward == pytest.approx(1.2)  # 0.1 a character, the real server's rule


def test_server_concurrency_serves_as_many_sessions_as_declared() -> None:
    """The guide: by default an OpenEnv server allows one session; an environment that declares
    SUPPORTS_CONCURRENT_SESSIONS, served with max_concurrent_envs=64, holds one session per generation.
    Run with OpenEnv's own create_app, server and client (openenv 0.10.0)."""
    from openenv.core.env_server import ConcurrencyConfigurationError, create_app
    from openenv.core.generic_client import GenericEnvClient

    from engine.in_process import serve_in_thread

    source = (HERE / "trl_openenv_concurrency.py").read_text()
    assert "    SUPPORTS_CONCURRENT_SESSIONS: bool = True\n" in source  # the guide's step 1, verbatim
    seed = run_block("trl_openenv_concurrency")

    class Undeclared(seed["_MyEnvironment"]):
        SUPPORTS_CONCURRENT_SESSIONS = False

    with pytest.raises(ConcurrencyConfigurationError):
        create_app(Undeclared, seed["MyAction"], seed["MyObservation"], max_concurrent_envs=64)

    def sessions_held(app, n: int) -> int:
        clients, held = [], 0
        with serve_in_thread(app, start_timeout_s=30) as url:
            try:
                for _ in range(n):  # all open at once, as one generation batch's environments are
                    client = GenericEnvClient(base_url=url).sync()
                    clients.append(client)
                    try:
                        client.reset()
                        result = client.step({"message": "hello"})
                    except Exception:  # noqa: BLE001 - the server refused the session: not held
                        continue
                    held += result.observation["echoed"] == "hello"
            finally:
                for client in clients:
                    client.close()
        return held

    assert sessions_held(seed["app"], 3) == 3
    default = create_app(seed["create_my_environment"], seed["MyAction"], seed["MyObservation"])
    assert sessions_held(default, 2) == 1  # OpenEnv's default: one concurrent session


def test_the_mask_example_trains_tokens_20_and_22_only(tiny_model_dir) -> None:
    """'Prompt [10, 11], completion [20, 21, 22] and mask [0, 0, 1, 0, 1] train on tokens 20 and 22.
    Token 21 stays context.' From OpenEnv's own TrainingTrace through our rows and batches into the
    policy's logprobs: only 20 and 22 get one."""
    from openenv.core.harness import TrainingTrace as OpenEnvTrace

    from capture_proxy.rows import build_training_rows
    from engine.tiny_model import load_model_and_tokenizer
    from trainer.logprobs import token_logprobs
    from trainer.packing import TrainItem, pack

    trace = OpenEnvTrace.model_validate({
        "schema_version": 1,
        "turns": [{
            "node_id": "call-0", "prompt_token_ids": [10, 11], "completion_token_ids": [20, 21, 22],
            "per_token_logps": [-0.5, -0.6, -0.7], "loss_mask": [0, 0, 1, 0, 1],
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
        }],
    })  # fmt: skip
    (row,) = build_training_rows(trace.model_dump(mode="json"))
    batch = pack([TrainItem(row, advantage=1.0)])
    trained = batch.input_ids[batch.loss_mask.bool()].tolist()
    assert trained == [20, 22]
    model, _ = load_model_and_tokenizer(tiny_model_dir)
    logps = token_logprobs(model, batch).logps
    assert batch.input_ids[logps != 0].tolist() == [20, 22]
    assert batch.behavior_logps[batch.loss_mask.bool()].tolist() == pytest.approx([-0.5, -0.7])  # not 21's
