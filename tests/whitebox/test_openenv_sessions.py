"""Our built-in environments under OpenEnv's own harness layer (openenv 0.10.0, the real package):
`MCPHarnessAdapter.run_white_box` and `build_harness_rollout_func` drive `EnvironmentSessionFactory`
sessions over EchoEnv, WordleEnv and CodingEnv, with a scripted model step, with OpenEnv's own model
step (`build_model_step(OpenAIClient)`) and with ours, both through a real capture proxy in front of
the vLLM imitation. The rewards are the environments' rubrics through the task's reward functions."""

from __future__ import annotations

import asyncio
import importlib
import sys

import openai
import pytest
from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import (
    CLIHarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    MCPHarnessAdapter,
    ModelStepResult,
    ResourceSession,
    ResourceSessionFactory,
    SessionMCPBridge,
    ToolResult,
    VerifyResult,
    build_harness_rollout_func,
)
from openenv.core.harness.collect import build_model_step
from openenv.core.llm_client import LLMResponse, OpenAIClient, ToolCall

from harnesses.env_factory import EnvironmentFactory
from harnesses.env_factory.errors import OpenEnvMissingError
from harnesses.env_factory.loop import initial_messages
from harnesses.env_factory.openenv_runner import ChatCompletionsModelStep, openai_tools
from harnesses.env_factory.openenv_sessions import EnvironmentResourceSession, EnvironmentSessionFactory
from tasks import load_task
from tasks.datasets import BUILTIN_DIR
from tasks.environments import (
    CodingEnv,
    EchoEnv,
    WordleEnv,
    coding_reward,
    echo_reward,
    wordle_invalid,
    wordle_partial,
    wordle_win,
)
from tests.whitebox.conftest import assert_masks_train_only_model_tokens

WORDLE_REWARDS = [wordle_win, wordle_partial, wordle_invalid]


class ScriptedModel:
    """An OpenEnv ModelStep answering each turn with the next scripted tool calls ([] ends the episode);
    it records what OpenEnv's adapter sent it."""

    def __init__(self, *turns: list[tuple[str, dict]]) -> None:
        self.turns = list(turns)
        self.seen: list[tuple[list[dict], list[Tool], dict]] = []

    def __call__(self, messages, tools, sampling) -> ModelStepResult:
        self.seen.append(([dict(m) for m in messages], list(tools), dict(sampling)))
        calls = self.turns.pop(0) if self.turns else []
        return ModelStepResult(
            response=LLMResponse(
                content="" if calls else "done",
                tool_calls=[
                    ToolCall(id=f"call-{len(self.seen)}-{i}", name=n, args=a)
                    for i, (n, a) in enumerate(calls)
                ],
            )
        )


def test_a_session_speaks_openenv_types_with_our_prompt_tools_and_rubrics():
    factory = EnvironmentSessionFactory(WordleEnv, reward_funcs=WORDLE_REWARDS)
    assert isinstance(factory, ResourceSessionFactory)
    session = factory.create({"prompt": "Play.", "secret": "crane"}, seed=1, episode_id="g0-0")
    try:
        assert isinstance(session, ResourceSession) and isinstance(session, EnvironmentResourceSession)
        assert session.row == {"prompt": "Play.", "secret": "crane", "seed": 1, "episode_id": "g0-0"}
        # The prompt our own loop would build: reset()'s observation appended to the user message.
        observation = WordleEnv().reset(secret="crane")
        assert session.initial_messages() == initial_messages("Play.", observation)
        tools = session.list_tools()
        assert all(isinstance(t, Tool) for t in tools) and [t.name for t in tools] == ["guess"]
        # Back in OpenAI form, the tools are exactly the schemas our loop sends.
        assert openai_tools(tools) == EnvironmentFactory(WordleEnv).tool_schemas

        first = session.call_tool("guess", {"guess": "slate"})
        assert isinstance(first, ToolResult) and first.error is None and not first.done
        assert first.data.startswith("S L A T E\n") and first.metadata == {}
        bad = session.call_tool("guess", {"guess": "xx"})  # the method raises ValueError
        assert bad.error == bad.data and bad.error.startswith("Error: ValueError: invalid guess 'xx'")
        unknown = session.call_tool("reset", {})  # reserved names are never tools
        assert unknown.error.startswith("Error: ToolCallError: unknown tool 'reset'")
        won = session.call_tool("guess", {"guess": "crane"})
        assert won.error is None and won.done and "You found the word in 2 guesses." in won.data

        verify = session.verify(session.initial_messages())
        assert isinstance(verify, VerifyResult) and verify.done
        win = 1.0 + 0.5 * (1 - 2 / 6)  # WordleRubric: won with the second valid guess
        assert verify.metrics == pytest.approx(
            {"wordle_win": win, "wordle_partial": 0.0, "wordle_invalid": -0.1}
        )
        assert verify.env_reward == pytest.approx(win - 0.1)
    finally:
        session.close()
    session.close()  # idempotent
    with pytest.raises(RuntimeError, match="is closed"):
        session.call_tool("guess", {"guess": "crane"})


def test_openenv_mcp_adapter_runs_the_echo_environment():
    factory = EnvironmentSessionFactory("tasks.environments.echo:EchoEnv", reward_funcs=[echo_reward])
    session = factory.create({"prompt": "Say it.", "target": "Hello World!"})
    model = ScriptedModel([("echo", {"message": "Hello"})], [("echo", {"message": "Hello World!"})])
    try:
        rollout = MCPHarnessAdapter().run_white_box(
            model, session, HarnessRunLimits(max_turns=5, sampling={"max_tokens": 32})
        )
        verify = session.verify(rollout.messages)
    finally:
        session.close()
    # The exact echo set env.done, which OpenEnv's adapter stops on.
    assert rollout.done and len(model.seen) == 2 and model.seen[0][2] == {"max_tokens": 32}
    assert [m["role"] for m in rollout.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [m["content"] for m in rollout.messages if m["role"] == "tool"] == ["Hello", "Hello World!"]
    assert [e.tool_name for e in rollout.tool_trace] == ["echo", "echo"]
    assert verify.env_reward == 1.0 and verify.metrics == {"echo_reward": 1.0}


def test_build_harness_rollout_func_trains_on_the_word_game_rubrics():
    factory = EnvironmentSessionFactory(WordleEnv, reward_funcs=WORDLE_REWARDS)
    rollout_func = build_harness_rollout_func(
        session_factory=factory,
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, session: ScriptedModel(*[[("guess", {"guess": "crane"})]] * 6),
        limits=HarnessRunLimits(max_turns=8),
    )
    rows = [{"prompt": "Play.", "secret": "crane"}, {"prompt": "Play.", "secret": "slate"}]
    out = rollout_func(rows, None)
    # crane: won with the first guess; slate: six guesses of crane, a and e right (2 greens of 5), lost.
    win = 1.0 + 0.5 * (1 - 1 / 6)
    assert out["env_reward"] == pytest.approx([win, 0.4])
    assert out["verify_metrics"] == [
        {"wordle_win": pytest.approx(win), "wordle_partial": 0.0, "wordle_invalid": 0.0},
        {"wordle_win": 0.0, "wordle_partial": pytest.approx(0.4), "wordle_invalid": 0.0},
    ]


def test_an_opaque_harness_reaches_the_session_over_openenvs_mcp_bridge():
    """OpenEnv's black-box path: CLIHarnessAdapter hands its runner a SessionMCPBridge (JSON-RPC
    tools/list and tools/call) over our session, as an external agent would see it."""

    def runner(bridge: SessionMCPBridge, session, limits) -> HarnessRolloutResult:
        listed = bridge.handle_request({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        call = {"name": "echo", "arguments": {"message": "Hello World!"}}
        said = bridge.handle_request({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        wrong = {"name": "echo", "arguments": {"msg": "hi"}}
        failed = bridge.handle_request({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": wrong})
        return HarnessRolloutResult(
            messages=session.initial_messages(), metrics={"replies": [listed, said, failed]}
        )

    session = EnvironmentSessionFactory(EchoEnv, reward_funcs=[echo_reward]).create("Say it.")
    try:
        rollout = CLIHarnessAdapter(runner).run_black_box(session)
        verify = session.verify(rollout.messages)
    finally:
        session.close()
    listed, said, failed = (r["result"] for r in rollout.metrics["replies"])
    schema = EnvironmentFactory(EchoEnv).tool_schemas[0]["function"]
    assert listed["tools"] == [
        {"name": "echo", "description": schema["description"], "inputSchema": schema["parameters"]}
    ]
    assert said == {"data": "Hello World!", "done": True, "metadata": {}, "error": None}
    assert failed["error"].startswith("Error: TypeError:") and failed["data"] == failed["error"]
    assert verify.env_reward == 1.0


def scores_nothing(environments, **kwargs):
    return [None for _ in environments]


def test_an_unscoreable_episode_is_none_and_openenv_refuses_it_rather_than_a_zero():
    factory = EnvironmentSessionFactory(EchoEnv, reward_funcs=[scores_nothing])
    session = factory.create("Say it.")
    assert session.verify(session.initial_messages()).env_reward is None
    session.close()
    rollout_func = build_harness_rollout_func(
        session_factory=factory,
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, session: ScriptedModel(),
    )
    with pytest.raises(ValueError, match="did not produce an environment reward"):
        rollout_func(["Say it."], None)


def test_reward_functions_see_trl_columns_prompts_and_completions():
    seen = {}

    def columns(environments, prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, **kwargs)
        return [float(len(completions[0]))]

    factory = EnvironmentSessionFactory(
        EchoEnv, reward_funcs=[echo_reward, columns], reward_weights=[1.0, 0.5], row={"level": 3}
    )
    session = factory.create({"instruction": "Say it.", "target": "hi"}, seed=4)
    rollout = MCPHarnessAdapter().run_white_box(ScriptedModel([("echo", {"message": "hi"})]), session)
    verify = session.verify(rollout.messages)
    session.close()
    assert seen["prompts"] == [[{"role": "user", "content": "Say it."}]]
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool"]
    assert seen["level"] == [3] and seen["seed"] == [4] and seen["target"] == ["hi"]
    assert verify.env_reward == 1.0 + 0.5 * 2 and verify.metrics == {"echo_reward": 1.0, "columns": 2.0}


def test_configuration_errors_are_found_when_the_factory_is_made():
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        EnvironmentSessionFactory(EchoEnv, reward_funcs=[echo_reward], reward_weights=[1.0, 2.0])
    with pytest.raises(ImportError, match="has no 'NoSuchEnv'"):
        EnvironmentSessionFactory("tasks.environments.echo:NoSuchEnv")
    with pytest.raises(TypeError, match="task must be a row"):
        EnvironmentSessionFactory(EchoEnv).create(42)


async def test_a_session_called_inside_a_running_loop_says_how_to_call_it():
    with pytest.raises(RuntimeError, match=r"asyncio.to_thread\(adapter.run_white_box"):
        EnvironmentSessionFactory(EchoEnv).create("Say it.")


async def test_the_coding_environment_acts_on_a_sandbox_under_openenvs_adapter(local_backend):
    """Async tools whose sandbox lives on the test's loop: the session runs them there (loop=) while
    OpenEnv's synchronous adapter runs in a worker thread."""
    task = load_task(BUILTIN_DIR / "wordcount-cli")
    sandbox = await local_backend.start(task.sandbox_spec("openenv-coding", proxy_port=9))
    factory = EnvironmentSessionFactory(
        CodingEnv, reward_funcs=[coding_reward], loop=asyncio.get_running_loop()
    )
    model = ScriptedModel(
        [("write_file", {"path": "notes.txt", "content": "hi\n"}), ("bash", {"command": "cat notes.txt"})],
        [("submit", {})],
    )
    try:
        row = {"instruction": task.instruction, "sandbox": sandbox, "workdir": "/app", "task": task}
        session = await asyncio.to_thread(factory.create, row, 1, "coding-0")
        rollout = await asyncio.to_thread(MCPHarnessAdapter().run_white_box, model, session)
        verify = await asyncio.to_thread(session.verify, rollout.messages)
        session.close()
    finally:
        await sandbox.stop()
    outputs = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    assert outputs == ["wrote 3 bytes to /app/notes.txt", "exit code 0\nhi\n", "Submitted. Test reward: 0.0"]
    assert [t.name for t in model.seen[0][1]] == ["bash", "read_file", "write_file", "submit"]
    assert rollout.done  # submit() ended the episode
    assert verify.env_reward == 0.0 and verify.metrics == {"coding_reward": 0.0}  # the real verifier


def test_openenvs_own_model_step_through_the_capture_proxy(proxy, imitation):
    """OpenEnv end to end on the driving side (its OpenAIClient, build_model_step, MCPHarnessAdapter)
    against our capture proxy: the capture is valid and the reward is the echo rubric's."""
    session = proxy.session(imitation.url, "imitation-model")
    client = OpenAIClient(session.base_url, None, model="imitation-model", api_key=session.api_key)
    factory = EnvironmentSessionFactory(EchoEnv, reward_funcs=[echo_reward])
    env_session = factory.create({"prompt": "Say: echo hello", "target": "echo hello"})
    try:
        rollout = MCPHarnessAdapter().run_white_box(build_model_step(client), env_session)
        verify = env_session.verify(rollout.messages)
    finally:
        env_session.close()
    assert rollout.done and verify.env_reward == 1.0  # the imitation echoes "echo hello"
    trace = proxy.trace(session.session_id)
    assert len(trace["turns"]) == 1
    assert trace["turns"][0]["request"]["tools"] == EnvironmentFactory(EchoEnv).tool_schemas
    assert_masks_train_only_model_tokens(trace)


def test_our_model_step_through_the_capture_proxy_returns_the_engines_tokens(proxy, imitation):
    session = proxy.session(imitation.url, "imitation-model")
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    rollout_func = build_harness_rollout_func(
        session_factory=EnvironmentSessionFactory(WordleEnv, reward_funcs=WORDLE_REWARDS),
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, s: ChatCompletionsModelStep(client, "imitation-model"),
        limits=HarnessRunLimits(max_turns=2, sampling={"max_tokens": 128}),
    )
    try:
        out = rollout_func([{"prompt": "Play.", "secret": "crane"}], None)
    finally:
        client.close()
    # The imitation guesses "echo hello" twice: two invalid moves, each sent back as the tool's error.
    assert out["env_reward"] == [pytest.approx(-0.2)]
    trace = proxy.trace(session.session_id)
    turns = trace["turns"]
    assert len(turns) == 2
    assert turns[1]["request"]["messages"][-1]["content"].startswith("Error: ValueError: invalid guess")
    assert_masks_train_only_model_tokens(trace)
    # What OpenEnv's rollout func hands a trainer are the tokens the proxy captured.
    assert out["prompt_ids"] == [[t for turn in turns for t in turn["prompt_token_ids"]]]
    assert out["completion_ids"] == [[t for turn in turns for t in turn["completion_token_ids"]]]
    assert out["logprobs"] == [[lp for turn in turns for lp in turn["per_token_logps"]]]


def test_without_openenv_the_adapter_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.harness", None)  # as if OpenEnv were not installed
    for name in ("harnesses.env_factory.openenv_sessions", "harnesses.env_factory.openenv_runner"):
        monkeypatch.delitem(sys.modules, name)
        with pytest.raises(OpenEnvMissingError, match=r"pip install 'harbor-rl\[openenv\]'"):
            importlib.import_module(name)
