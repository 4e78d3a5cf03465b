"""The harness layer: resolve_env_reward's three outcomes, the MCP bridge (reserved names refused),
StepEnvSessionAdapter over a reset/step client, both adapters, and the TRL-style rollout function,
whose white-box model steps go through the real capture proxy to the vLLM imitation."""

from __future__ import annotations

import json

import openai
import pytest

from harnesses.errors import HarnessConfigError
from harnesses.layer import (
    CLIHarnessAdapter,
    HarnessRunLimits,
    MCPHarnessAdapter,
    ResourceSession,
    SessionMCPBridge,
    StepEnvSessionAdapter,
    ToolResult,
    ToolTraceEntry,
    VerifyResult,
    build_harness_rollout_func,
    openai_model_step,
)
from harnesses.rewards import EnvRewardError, resolve_env_reward

GUESS_TOOL = {
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the word.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


class GuessClient:
    """A reset/step/state client (the shape of OpenEnv's clients), with an async-style `.sync()`."""

    def __init__(self, secret: str = "hello", max_steps: int = 3, rewarding: bool = True) -> None:
        self.secret, self.max_steps, self.rewarding = secret, max_steps, rewarding
        self.steps, self.closed, self.synced = 0, False, False

    def sync(self) -> GuessClient:
        self.synced = True
        return self

    def reset(self, **kwargs):
        self.steps = 0
        return {"observation": f"Guess a {len(self.secret)}-letter word."}

    def step(self, action: dict):
        self.steps += 1
        word = action["word"]
        reward = len(set(word) & set(self.secret)) / len(set(self.secret))
        return {
            "observation": f"{word}: {reward:.2f}",
            "reward": reward if self.rewarding else None,
            "done": self.steps >= self.max_steps or word == self.secret,
        }

    def state(self):
        return {"steps": self.steps}

    def close(self):
        self.closed = True


def guess_session(**client_kwargs) -> StepEnvSessionAdapter:
    return StepEnvSessionAdapter(
        GuessClient(**client_kwargs),
        tools=[GUESS_TOOL],
        action_builder=lambda name, args: {"word": args["word"]},
    )


def entry(reward):
    return ToolTraceEntry(turn=0, name="guess", result=ToolResult(content="", reward=reward))


# -- resolve_env_reward -------------------------------------------------------------------------


def test_resolve_env_reward_takes_the_last_tool_reward_and_cross_checks_verify():
    trace = [entry(0.2), entry(0.5), entry(None)]
    assert resolve_env_reward(trace, VerifyResult(env_reward=None)) == 0.5
    assert resolve_env_reward(trace, VerifyResult(env_reward=0.5 + 5e-7)) == 0.5  # within abs 1e-6
    assert resolve_env_reward([], VerifyResult(env_reward=0.75)) == 0.75
    assert resolve_env_reward([{"result": {"reward": 1}}], None) == 1.0


def test_resolve_env_reward_refuses_a_verify_reward_that_disagrees():
    with pytest.raises(EnvRewardError, match="verify.env_reward must forward the environment reward"):
        resolve_env_reward([entry(0.5)], VerifyResult(env_reward=0.5 + 1e-5))


def test_resolve_env_reward_without_any_reward_is_an_error_not_zero():
    with pytest.raises(EnvRewardError, match="rollout did not produce an environment reward"):
        resolve_env_reward([entry(None)], VerifyResult(env_reward=None))
    with pytest.raises(EnvRewardError, match="rollout did not produce an environment reward"):
        resolve_env_reward([], None)


# -- the MCP bridge -------------------------------------------------------------------------------


class ListsReserved:
    """A session that (wrongly) offers tools named like the episode protocol."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def initial_messages(self):
        return [{"role": "user", "content": "go"}]

    def list_tools(self):
        reserved = [
            {"type": "function", "function": {"name": n, "parameters": {}}} for n in ("reset", "close")
        ]
        return [GUESS_TOOL, *reserved]

    def call_tool(self, name, arguments):
        self.calls.append(name)
        return ToolResult(content=f"called {name} with {arguments}", reward=0.25, done=True)

    def verify(self, messages=None):
        return VerifyResult(env_reward=0.25)

    def close(self):
        pass


def rpc(bridge: SessionMCPBridge, method: str, params=None, request_id=1) -> dict:
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
    return json.loads(bridge.handle_json(line))


def test_bridge_speaks_mcp_tools_list_and_call():
    session = ListsReserved()
    assert isinstance(session, ResourceSession)
    bridge = SessionMCPBridge(session)
    init = rpc(bridge, "initialize", {"protocolVersion": "2025-06-18"})
    assert init["result"]["capabilities"] == {"tools": {"listChanged": False}}
    tools = rpc(bridge, "tools/list")["result"]["tools"]
    assert [t["name"] for t in tools] == ["guess"]  # reserved names are not offered
    assert tools[0]["inputSchema"]["required"] == ["word"]
    reply = rpc(bridge, "tools/call", {"name": "guess", "arguments": {"word": "hi"}}, request_id=7)
    assert reply["id"] == 7
    assert reply["result"]["content"] == [{"type": "text", "text": "called guess with {'word': 'hi'}"}]
    assert reply["result"]["isError"] is False
    assert reply["result"]["structuredContent"] == {"reward": 0.25, "done": True}
    assert [e.name for e in bridge.tool_trace] == ["guess"]


@pytest.mark.parametrize("name", ["reset", "step", "state", "close"])
def test_bridge_refuses_reserved_names(name):
    session = ListsReserved()
    bridge = SessionMCPBridge(session)
    reply = rpc(bridge, "tools/call", {"name": name, "arguments": {}})
    assert reply["error"]["code"] == -32602 and "reserved" in reply["error"]["message"]
    assert session.calls == [] and bridge.tool_trace == []


def test_bridge_reports_protocol_errors():
    bridge = SessionMCPBridge(ListsReserved(), max_total_tool_calls=1)
    assert json.loads(bridge.handle_json("{not json"))["error"]["code"] == -32700
    assert rpc(bridge, "resources/list")["error"]["code"] == -32601
    assert bridge.handle({"jsonrpc": "1.0", "method": "x"})["error"]["code"] == -32600
    assert bridge.handle_json(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})) is None
    assert rpc(bridge, "tools/call", {"arguments": {}})["error"]["code"] == -32602
    assert "result" in rpc(bridge, "tools/call", {"name": "guess", "arguments": {"word": "a"}})
    assert (
        "budget"
        in rpc(bridge, "tools/call", {"name": "guess", "arguments": {"word": "b"}})["error"]["message"]
    )


# -- StepEnvSessionAdapter ----------------------------------------------------------------------


def test_step_env_adapter_wraps_a_reset_step_client():
    session = guess_session(secret="hello")
    assert session.client.synced  # .sync() was used: the layer is synchronous
    assert session.initial_messages() == [{"role": "user", "content": "Guess a 5-letter word."}]
    result = session.call_tool("guess", {"word": "help"})
    assert result.reward == pytest.approx(0.75) and not result.done
    assert result.metadata == {"state": {"steps": 1}}
    assert session.call_tool("guess", {"word": "hello"}).done
    assert session.verify() == VerifyResult(env_reward=1.0, done=True, metrics={"steps": 2})
    assert session.call_tool("jump", {}).error == "unknown tool 'jump'"
    session.close()
    assert session.client.closed


def test_step_env_adapter_refuses_reserved_tool_names():
    step_tool = {"type": "function", "function": {"name": "step", "parameters": {}}}
    with pytest.raises(HarnessConfigError, match="'step' is reserved"):
        StepEnvSessionAdapter(GuessClient(), tools=[step_tool], action_builder=lambda n, a: a)


# -- adapters and the rollout function, against the capture proxy -------------------------------


@pytest.fixture
def model_step_builder(proxy, imitation):
    clients = []

    def build(trainer):
        session = proxy.session(imitation.url, "imitation-model")
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        clients.append(client)
        return openai_model_step(client, "imitation-model")

    yield build
    for client in clients:
        client.close()


def test_white_box_adapter_samples_runs_tools_and_verifies(model_step_builder):
    session = guess_session(secret="hello", max_steps=10)
    limits = HarnessRunLimits(max_turns=2, sampling={"temperature": 1.0})
    result = MCPHarnessAdapter().run_white_box(session, model_step_builder(None), limits)
    assert [e.name for e in result.tool_trace] == ["guess", "guess"]
    assert result.tool_trace[0].arguments == {"word": "echo hello"}
    assert result.metrics["truncated"] is True and result.metrics["num_turns"] == 2
    assert result.prompt_ids and len(result.completion_ids) == len(result.logprobs) > 0
    assert all(lp <= 0 for lp in result.logprobs)
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert result.verify.env_reward == result.tool_trace[-1].result.reward
    with pytest.raises(NotImplementedError, match="CLIHarnessAdapter"):
        MCPHarnessAdapter().run_black_box(session, limits)


def test_white_box_adapter_stops_at_done_and_at_the_total_tool_call_limit(model_step_builder):
    step = model_step_builder(None)
    done = MCPHarnessAdapter().run_white_box(guess_session(max_steps=1), step, HarnessRunLimits(max_turns=5))
    assert done.done and len(done.tool_trace) == 1 and done.metrics["truncated"] is False
    capped = MCPHarnessAdapter().run_white_box(
        guess_session(max_steps=10), step, HarnessRunLimits(max_turns=5, max_total_tool_calls=1)
    )
    assert len(capped.tool_trace) == 1 and capped.metrics["truncated"] is True
    assert capped.metrics["num_turns"] == 2  # the second turn asked for a call past the limit


def test_black_box_adapter_hands_the_runner_an_mcp_bridge():
    def runner(bridge, messages, limits):
        names = [t["name"] for t in json.loads(bridge.handle_json(json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})))["result"]["tools"]]  # fmt: skip
        for i, word in enumerate(["help", "hello"]):
            request = {
                "jsonrpc": "2.0",
                "id": i + 2,
                "method": "tools/call",
                "params": {"name": names[0], "arguments": {"word": word}},
            }
            bridge.handle_json(json.dumps(request))
        return [*messages, {"role": "assistant", "content": "done"}]

    session = guess_session(secret="hello")
    result = CLIHarnessAdapter(runner).run_black_box(session, HarnessRunLimits())
    assert [e.arguments["word"] for e in result.tool_trace] == ["help", "hello"]
    assert result.done and result.messages[-1]["content"] == "done"
    assert resolve_env_reward(result.tool_trace, result.verify) == 1.0
    with pytest.raises(NotImplementedError, match="MCPHarnessAdapter"):
        CLIHarnessAdapter(runner).run_white_box(session, lambda *a: None, HarnessRunLimits())


class GuessFactory:
    def __init__(self, rewarding: bool = True) -> None:
        self.rewarding = rewarding
        self.sessions: list[StepEnvSessionAdapter] = []
        self.created: list[tuple] = []

    def create(self, task, seed=None, episode_id=None):
        self.created.append((task, seed, episode_id))
        session = guess_session(secret=task, max_steps=2, rewarding=self.rewarding)
        self.sessions.append(session)
        return session


def test_rollout_function_gives_trl_columns_one_closed_session_per_prompt(model_step_builder):
    factory = GuessFactory()
    rollout = build_harness_rollout_func(
        factory, MCPHarnessAdapter(), model_step_builder, HarnessRunLimits(max_turns=3)
    )

    class Trainer:
        class args:
            seed = 11

    out = rollout(["hello", "world"], Trainer())
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_reward", "verify_metrics"}
    assert [t for t, _, _ in factory.created] == ["hello", "world"]
    assert [s for _, s, _ in factory.created] == [11, 11] and factory.created[1][2] == "rollout-000001"
    assert all(s.client.closed for s in factory.sessions)
    expected = [s.last_reward for s in factory.sessions]
    assert out["env_reward"] == expected and all(r is not None for r in expected)
    assert out["verify_metrics"] == [{"steps": 2}, {"steps": 2}]
    for ids, lps in zip(out["completion_ids"], out["logprobs"], strict=True):
        assert len(ids) == len(lps) > 0


def test_rollout_function_without_an_environment_reward_fails_and_still_closes(model_step_builder):
    factory = GuessFactory(rewarding=False)
    rollout = build_harness_rollout_func(
        factory, MCPHarnessAdapter(), model_step_builder, reward_key="reward"
    )
    with pytest.raises(EnvRewardError, match="rollout did not produce an environment reward"):
        rollout(["hello"], None)
    assert factory.sessions[0].client.closed


def test_environment_factory_classes_plug_into_the_layer(model_step_builder):
    """The built-in word game as a ResourceSession: the imitation guesses "echo hello" (invalid), the
    environment's penalty is both the tool results' reward and what verify() forwards."""
    from harnesses.env_factory.builtin import WordleEnv
    from harnesses.layer import EnvironmentSessionFactory

    sessions = EnvironmentSessionFactory(WordleEnv)
    rollout = build_harness_rollout_func(
        sessions, MCPHarnessAdapter(), model_step_builder, HarnessRunLimits(max_turns=2)
    )
    out = rollout([{"prompt": "Play the word game.", "secret": "crane"}], None)
    assert out["env_reward"] == [pytest.approx(-0.2)]
    assert len(out["completion_ids"][0]) == len(out["logprobs"][0]) > 0

    session = sessions.create("Play.", seed=3)
    assert session.initial_messages()[0]["content"].startswith("Play.\n\nGuess the secret 5-letter word")
    assert [t["function"]["name"] for t in session.list_tools()] == ["guess"]
    result = session.call_tool("guess", {"word": session.env.secret})
    assert result.done and result.error is None and result.reward == session.env.reward > 1.0
    assert session.verify().env_reward == result.reward
    session.close()
