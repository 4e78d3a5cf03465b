"""The capture proxy (capture_proxy.app) in front of the real engine: traces validate with no FATAL
finding for chat with tools, completions and streaming, and carry the engine's tokens, logprobs and
policy version."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.engine.conftest import engine_app, serve
from tests.engine.scripted_model import build_scripted_model

try:
    from capture_proxy.app import create_app as create_proxy_app
    from capture_proxy.config import ProxyConfig
    from capture_proxy.store import TraceStore
    from capture_proxy.validation import validate_trace
except ImportError as exc:  # the proxy is built by another issue; this test runs once it exists
    pytest.skip(f"capture_proxy.app is not importable yet: {exc}", allow_module_level=True)

ADMIN = "engine-test-admin-key"
TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture(scope="module")
def scripted_url(tiny_dir, tmp_path_factory):
    folder = build_scripted_model(tiny_dir, tmp_path_factory.mktemp("scripted-proxy"))
    with serve(engine_app(folder)) as url:
        yield url


@pytest.fixture
def proxy(tmp_path):
    store = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    app = create_proxy_app(ProxyConfig(admin_key=ADMIN), store)
    with serve(app) as url:
        yield url
    store.close()


def open_session(proxy: str, engine_url: str, **spec):
    r = httpx.post(
        f"{proxy}/sessions",
        json={"llm_url": engine_url, "model": "tiny", "multi_step_task": True, **spec},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    return body["session_id"], openai.OpenAI(
        base_url=body["base_url"], api_key=body["api_key"], max_retries=0
    )


def trace_of(proxy: str, session_id: str) -> dict:
    r = httpx.get(f"{proxy}/sessions/{session_id}/trace", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    trace = r.json()
    fatal = [f for f in validate_trace(trace) if f.severity == "FATAL"]
    assert fatal == []
    return trace


def test_chat_with_tool_calls_through_the_proxy(proxy, scripted_url):
    session_id, agent = open_session(proxy, scripted_url)
    messages = [{"role": "user", "content": "hi"}]
    first = agent.chat.completions.create(model="anything", messages=messages, tools=TOOLS)
    (call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "bash"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "README.md"},
    ]
    streamed = agent.chat.completions.create(
        model="anything", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    calls = [tc for chunk in streamed if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["bash"]

    trace = trace_of(proxy, session_id)
    assert len(trace["turns"]) == 2
    for turn in trace["turns"]:
        assert turn["metadata"]["capture"] == "ok" and turn["metadata"]["policy_version"] == 0
        assert turn["metadata"]["finish_reason"] == "tool_calls"
        assert len(turn["per_token_logps"]) == len(turn["completion_token_ids"]) > 0
    assert trace["turns"][1]["metadata"]["streamed"] is True


def test_completions_and_streams_through_the_proxy(proxy, engine, reference):
    session_id, agent = open_session(proxy, engine.url, sampling={"temperature": 0.8})
    agent.completions.create(model="anything", prompt="def add(a, b):", max_tokens=12)
    list(agent.completions.create(model="anything", prompt="import os", max_tokens=8, stream=True))
    messages = [{"role": "user", "content": "List the files."}]
    list(
        agent.chat.completions.create(
            model="anything", messages=messages, tools=TOOLS, max_tokens=10, stream=True
        )
    )

    trace = trace_of(proxy, session_id)
    assert len(trace["turns"]) == 3
    model, _ = reference
    for turn in trace["turns"]:
        assert turn["metadata"]["capture"] == "ok" and turn["metadata"]["policy_version"] == 0
        prompt, completion = turn["prompt_token_ids"], turn["completion_token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
        assert turn["per_token_logps"] == pytest.approx(expected.tolist(), abs=1e-5)
