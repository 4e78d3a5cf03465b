"""The multi-turn loop through the real capture proxy, with the real `openai` client, in front of the
vLLM imitation (which, offered tools, always calls one with arguments such as "echo hello"): each stop
condition, tool exceptions as tool messages counted as failures, and the captured trace."""

from __future__ import annotations

import httpx
import pytest

from harnesses.env_factory import EnvironmentFactory, EpisodeError, LoopConfig, run_episode
from tasks.environments import EchoEnv, WordleEnv
from tests.whitebox.conftest import assert_masks_train_only_model_tokens

MODEL = "imitation-model"


async def _episode(proxy, imitation, env_cls, *, row=None, **config):
    # A white-box episode may rightly be one call (the model answered without tools), so the
    # session is not marked multi-step (EnvFactoryHarness.multi_step_task is False too).
    session = proxy.session(imitation.url, MODEL, multi_step_task=False)
    factory = EnvironmentFactory(env_cls)
    env = factory.create()
    client = session.client()
    try:
        result = await run_episode(
            factory, env, client, model=MODEL, prompt="Play.", row=row or {}, config=LoopConfig(**config)
        )
    finally:
        await client.close()
    return session, env, result


async def test_tool_calls_run_on_the_instance_until_max_tool_calling_iterations(proxy, imitation):
    session, env, result = await _episode(proxy, imitation, EchoEnv, max_tool_calling_iterations=3)
    assert result.stop_reason == "max_tool_calling_iterations"
    assert result.model_calls == 3 and result.tool_calls_by_name == {"echo": 3} and result.tool_failures == 0
    assert env.echoes == ["echo hello"] * 3
    assert 0 < env.reward < 1  # partial credit: similar to "Hello World!", not equal
    roles = [m["role"] for m in result.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert result.messages[2] == {
        "role": "tool",
        "tool_call_id": result.messages[1]["tool_calls"][0]["id"],
        "name": "echo",
        "content": "echo hello",
    }

    trace = proxy.trace(session.session_id)
    assert len(trace["turns"]) == 3
    assert_masks_train_only_model_tokens(trace)
    # The tool's result reached the model as context of the next call, and is masked there.
    second = trace["turns"][1]
    assert second["request"]["messages"][-1]["content"] == "echo hello"
    assert second["request"]["tools"][0]["function"]["name"] == "echo"


async def test_a_raising_tool_becomes_the_tool_message_and_counts_as_a_failure(proxy, imitation):
    session, env, result = await _episode(
        proxy, imitation, WordleEnv, row={"secret": "crane"}, max_tool_calling_iterations=2
    )
    assert result.stop_reason == "max_tool_calling_iterations"
    assert result.tool_failures == 2 and env.invalid_moves == 2
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages == ["Error: ValueError: invalid guess 'echo hello': guess a 5-letter word"] * 2
    assert [c.failed for c in result.tool_calls] == [True, True]
    assert env.reward == pytest.approx(-0.2)  # the invalid-move penalty, from the environment
    trace = proxy.trace(session.session_id)
    assert trace["turns"][1]["request"]["messages"][-1]["content"].startswith("Error: ValueError")
    # reset()'s observation was appended to the prompt's user message.
    assert result.messages[0]["content"].startswith("Play.\n\nGuess the secret 5-letter word")


async def test_stops_when_the_model_calls_no_tool(proxy, imitation):
    session, env, result = await _episode(proxy, imitation, EchoEnv, extra_body={"tool_choice": "none"})
    assert result.stop_reason == "no_tool_call"
    assert result.model_calls == 1 and result.tool_calls == [] and env.echoes == []
    assert env.reward == 0.0  # played and earned nothing: a score, not a missing one
    assert len(proxy.trace(session.session_id)["turns"]) == 1


async def test_stops_at_max_completion_length_across_turns(proxy, imitation):
    _, _, probe = await _episode(proxy, imitation, EchoEnv, max_tool_calling_iterations=1)
    per_turn = probe.completion_tokens
    httpx.get(f"{imitation.url}/imitation/requests")  # (requests are logged; we read them below)
    session, env, result = await _episode(
        proxy, imitation, EchoEnv, max_tool_calling_iterations=None, max_completion_length=2 * per_turn
    )
    assert result.stop_reason == "max_completion_length"
    assert result.model_calls == 2 and result.completion_tokens == 2 * per_turn
    sent = [r for r in httpx.get(f"{imitation.url}/imitation/requests").json() if "messages" in r]
    # Each call's max_tokens is what is left of the episode's budget.
    assert [r["max_tokens"] for r in sent[-2:]] == [2 * per_turn, per_turn]


async def test_max_tokens_per_turn_caps_each_call(proxy, imitation):
    session, env, result = await _episode(proxy, imitation, EchoEnv, max_tokens_per_turn=5)
    # Cut at 5 tokens the tool call is incomplete, so the model "called no tool".
    assert result.stop_reason == "no_tool_call" and result.completion_tokens == 5
    turn = proxy.trace(session.session_id)["turns"][0]
    assert turn["metadata"]["finish_reason"] == "length"


async def test_stops_when_the_environment_is_done(proxy, imitation):
    session, env, result = await _episode(proxy, imitation, EchoEnv, row={"target": "echo hello"})
    assert result.stop_reason == "env_done" and result.model_calls == 1
    assert env.reward == 1.0


async def test_a_failed_model_call_ends_the_episode_with_an_error(proxy, imitation):
    imitation.configure(fail="http_500")
    with pytest.raises(EpisodeError, match="model call 1 failed"):
        await _episode(proxy, imitation, EchoEnv)
