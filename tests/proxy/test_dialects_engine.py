"""The `anthropic` and `openai` SDKs through the proxy in front of the embedded engine itself: the tiny
model's checkpoint with hand-set weights (tests/engine/scripted_model.py) that writes a hermes tool
call, so a Messages or Responses exchange is a real tool-calling exchange, each turn holding the
engine's own prompt ids, sampled ids and logprobs. (Whether the second call extends the first in the
rollout graph is the chat template's business, here as for chat: this model writes its call without the
newlines the template renders; tests/proxy/test_dialects.py checks the link where the template replays
what the model wrote.)"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from capture_proxy.validation import validate_trace
from engine.tiny_model import build_tiny_model
from tests.engine.conftest import engine_app, serve
from tests.engine.scripted_model import build_scripted_model

ADMIN = "dialects-engine-admin-key"
BASH_SCHEMA = {"type": "object", "properties": {}}
COLD = {"temperature": 0.05}
"""A train session's policy temperature: the scripted logits (10 against 0) become a sure choice."""


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    tiny = build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))
    folder = build_scripted_model(tiny, tmp_path_factory.mktemp("scripted-dialects"))
    with serve(engine_app(folder)) as url:
        yield url


@pytest.fixture
def proxy(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    with serve(create_app(ProxyConfig(admin_key=ADMIN), store)) as url:
        yield url
    store.close()


def open_session(proxy: str, engine_url: str) -> dict:
    spec = {"llm_url": engine_url, "model": "tiny", "multi_step_task": True, "sampling": COLD}
    reply = httpx.post(f"{proxy}/sessions", json=spec, headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 201, reply.text
    return reply.json()


def engine_turns(proxy: str, engine_url: str, session_id: str) -> list[dict]:
    """The trace's turns, each checked against the engine's answer to its recorded chat request."""
    reply = httpx.get(f"{proxy}/sessions/{session_id}/trace", headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 200, reply.text
    trace = reply.json()
    assert [f for f in validate_trace(trace) if f.severity == "FATAL"] == []
    for turn in trace["turns"]:
        request = {k: v for k, v in turn["request"].items() if k not in ("stream", "stream_options")}
        direct = {
            **request,
            **turn["metadata"]["sampling"],
            "model": "tiny",
            "logprobs": True,
            "top_logprobs": 0,
        }
        engine = httpx.post(
            f"{engine_url}/v1/chat/completions", json={**direct, "return_token_ids": True}
        ).json()
        choice = engine["choices"][0]
        assert turn["prompt_token_ids"] == engine["prompt_token_ids"]
        assert turn["completion_token_ids"] == choice["token_ids"]
        assert turn["per_token_logps"] == pytest.approx(
            [c["logprob"] for c in choice["logprobs"]["content"]], abs=1e-4
        )
        assert turn["metadata"]["capture"] == "ok" and turn["metadata"]["finish_reason"] == "tool_calls"
    return trace["turns"]


def test_anthropic_sdk_against_the_embedded_engine(proxy, engine_url):
    session = open_session(proxy, engine_url)
    client = anthropic.Anthropic(base_url=proxy, api_key=session["api_key"], max_retries=0)
    tools = [{"name": "bash", "description": "Run a command.", "input_schema": BASH_SCHEMA}]
    messages = [{"role": "user", "content": "hi"}]
    first = client.messages.create(model="claude", max_tokens=64, messages=messages, tools=tools)
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.content[0].text == "Sure."
    assert first.content[1].name == "bash" and first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": first.content[1].id, "content": "ok"}],
        },
    ]
    with client.messages.stream(model="claude", max_tokens=64, messages=messages, tools=tools) as stream:
        second = stream.get_final_message()
    assert [b.type for b in second.content] == ["text", "tool_use"] and second.content[1].name == "bash"

    turns = engine_turns(proxy, engine_url, session["session_id"])
    assert len(turns) == 2 and turns[1]["metadata"]["streamed"]
    assert {t["metadata"]["dialect"] for t in turns} == {"anthropic-messages"}


def test_openai_responses_sdk_against_the_embedded_engine(proxy, engine_url):
    session = open_session(proxy, engine_url)
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    tools = [{"type": "function", "name": "bash", "description": "Run a command.", "parameters": BASH_SCHEMA}]
    conversation: list = [{"role": "user", "content": "hi"}]
    first = client.responses.create(model="gpt", input=conversation, tools=tools)
    assert [item.type for item in first.output] == ["message", "function_call"]
    assert first.output_text == "Sure." and first.output[1].name == "bash"
    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append({"type": "function_call_output", "call_id": first.output[1].call_id, "output": "ok"})
    with client.responses.stream(model="gpt", input=conversation, tools=tools) as stream:
        second = stream.get_final_response()
    assert [item.type for item in second.output] == ["message", "function_call"]

    turns = engine_turns(proxy, engine_url, session["session_id"])
    assert len(turns) == 2 and turns[1]["metadata"]["streamed"]
    assert {t["metadata"]["dialect"] for t in turns} == {"openai-responses"}
