"""`stream_mode = "replay"`: a streamed call goes to the engine unstreamed and comes back to the agent as
one event stream, after its turn is stored.

The agents are the real `openai` and `anthropic` SDKs, with their own stream accumulators; the engine is
`engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a GPU), which answers
the same prompt the same way streamed or not, so the relayed and replayed streams can be compared.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.proxy.conftest import MODEL, Proxy, start_proxy
from tests.proxy.test_capture import MESSAGES, TOOLS, assert_turn_matches_engine, engine_view


@pytest.fixture
def replay(imitation, store):
    app, server = start_proxy(imitation, store, stream_mode="replay")
    with server as url:
        yield Proxy(url, app.state.service, store)


def _streamed_chat(proxy: Proxy, **kwargs) -> tuple[dict, int, str]:
    """What an agent reads from one streamed chat call (the SDK's own accumulation), the number of
    events it got, and the session id."""
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    events = 0
    with client.chat.completions.stream(model=MODEL, messages=MESSAGES, **kwargs) as stream:
        for _ in stream:
            events += 1
        final = stream.get_final_completion()
    choice = final.choices[0]
    view = {
        "content": choice.message.content,
        "tool_calls": [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()],
        "finish_reason": choice.finish_reason,
        "logprobs": [(c.token, c.logprob) for c in (choice.logprobs.content or ())]
        if choice.logprobs
        else None,
        "usage": final.usage.model_dump() if final.usage else None,
    }
    return view, events, session.session_id


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["text", "tool-call"])
def test_a_replayed_stream_reads_as_the_relayed_one_and_is_captured_alike(proxy, replay, imitation, tools):
    kwargs = {"logprobs": True, "stream_options": {"include_usage": True}} | (
        {"tools": tools} if tools else {}
    )
    relayed, relayed_events, _ = _streamed_chat(proxy, **kwargs)
    replayed, replayed_events, session_id = _streamed_chat(replay, **kwargs)

    assert replayed == relayed
    assert relayed["logprobs"] and relayed["usage"]["completion_tokens"] == len(relayed["logprobs"])
    assert relayed_events > 10  # the relay passed the engine's events on one by one
    sent = imitation.requests()[-1]
    assert sent["stream"] is False and "stream_options" not in sent  # vLLM 400s stream_options unstreamed
    (turn,) = replay.store.get_turns(session_id)
    body = {"messages": MESSAGES} | ({"tools": tools} if tools else {})
    assert_turn_matches_engine(turn, engine_view(imitation, "chat/completions", body), "chat")
    assert turn.metadata.streamed is True
    assert replayed_events < relayed_events


def test_replayed_events_carry_only_what_the_agent_asked_for(replay):
    session = replay.create()
    headers = {"Authorization": f"Bearer {session.api_key}"}
    url = f"{session.base_url}/chat/completions"

    def events(body: dict) -> list[bytes]:
        r = httpx.post(
            url, json={"model": MODEL, "messages": MESSAGES, "stream": True, **body}, headers=headers
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        payloads = [line[6:] for line in r.content.split(b"\n\n") if line.startswith(b"data: ")]
        assert payloads[-1] == b"[DONE]"
        return [orjson.loads(p) for p in payloads[:-1]]

    (plain,) = events({})  # no usage event unless asked
    assert plain["object"] == "chat.completion.chunk" and plain["choices"][0]["delta"]["role"] == "assistant"
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["logprobs"] is None and plain["choices"][0]["finish_reason"] == "stop"

    first, usage = events({"return_token_ids": True, "stream_options": {"include_usage": True}})
    turns = replay.store.get_turns(session.session_id)
    assert first["prompt_token_ids"] == turns[-1].prompt_token_ids
    assert first["choices"][0]["token_ids"] == turns[-1].completion_token_ids
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(
        turns[-1].completion_token_ids
    )


async def test_replayed_completions_stream(replay, imitation):
    session = replay.create()
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    text = ""
    async for chunk in await client.completions.create(model=MODEL, prompt="def add(a, b):", stream=True):
        text += chunk.choices[0].text if chunk.choices else ""
    await client.close()
    engine = engine_view(imitation, "completions", {"prompt": "def add(a, b):"})
    assert text == engine["choices"][0]["text"]
    (turn,) = replay.store.get_turns(session.session_id)
    assert_turn_matches_engine(turn, engine, "completions")


def test_anthropic_messages_stream_through_replay(replay, imitation):
    session = replay.create()
    client = anthropic.Anthropic(base_url=replay.url, api_key=session.api_key, max_retries=0)
    tool = {
        "name": "bash",
        "description": "Run a command.",
        "input_schema": TOOLS[0]["function"]["parameters"],
    }
    with client.messages.stream(
        model="claude-sonnet",
        max_tokens=300,
        messages=[{"role": "user", "content": "List files."}],
        tools=[tool],
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert message.stop_reason == "tool_use" and message.content[-1].input == {"command": "echo hello"}
    (turn,) = replay.store.get_turns(session.session_id)
    assert turn.metadata.capture == "ok" and turn.metadata.dialect == "anthropic-messages"
    assert message.usage.output_tokens == len(turn.completion_token_ids)


@pytest.mark.parametrize("fail", ["http_500", "cut"])
def test_an_engine_failure_is_a_502_before_any_event(replay, imitation, fail):
    imitation.configure(fail=fail)
    session = replay.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert err.value.status_code == 502
    (turn,) = replay.store.get_turns(session.session_id)
    assert turn.metadata.capture == "transport_error" and turn.metadata.error
