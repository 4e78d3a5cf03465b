"""vLLM's own hermes tool parser on the tiny tokenizer's markup, through the capture proxy: a model folder
whose weights write `<tool_call>{"name": "bash"}</tool_call>` (tests/engine/scripted_model.py) served by
the live vLLM (a server of its own). Streamed, the agent gets a parsed tool call, and the stored ids are
the tokens vLLM sampled, markup included. Whole, vLLM 0.32's hermes parser refuses a call without
"arguments" (it reads `function_call["arguments"]`, vllm/tool_parsers/hermes_tool_parser.py) and returns the
text as content, where its streaming parser and the embedded engine's accept it: a difference the embedded
engine does not share yet. (The scripted model can write no call with "arguments": its tokens would repeat.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from capture_proxy.app import create_app as create_proxy_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from engine.in_process import serve_in_thread
from tests.engine.scripted_model import TOOL_CALL_TEXT, build_scripted_model
from tests.vllm_live.conftest import live_vllm

pytestmark = pytest.mark.timeout(900)
ADMIN = "vllm-live-admin-key"
MESSAGES = [{"role": "user", "content": "hi"}]
SCRIPT = TOOL_CALL_TEXT
TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture(scope="module")
def scripted_vllm(tiny_path, tmp_path_factory):
    folder = build_scripted_model(tiny_path, tmp_path_factory.mktemp("scripted"))
    with live_vllm(folder, "scripted", tmp_path_factory.mktemp("vllm-scripted")) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    store = TraceStore(f"sqlite:///{tmp_path_factory.mktemp('proxy')}/traces.db")
    with serve_in_thread(create_proxy_app(ProxyConfig(admin_key=ADMIN), store), log_level="warning") as url:
        yield url, store
    store.close()


def _session(proxy_url: str, vllm) -> tuple[str, openai.OpenAI]:
    r = httpx.post(
        f"{proxy_url}/sessions", json={"llm_url": vllm.url, "model": "scripted"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    agent = openai.OpenAI(base_url=r.json()["base_url"], api_key=r.json()["api_key"], max_retries=0)
    return r.json()["session_id"], agent


def _turn(proxy_url: str, session_id: str) -> dict:
    trace = httpx.get(
        f"{proxy_url}/sessions/{session_id}/trace", headers={"Authorization": f"Bearer {ADMIN}"}
    ).json()
    (turn,) = trace["turns"]
    assert turn["metadata"]["capture"] == "ok"
    assert len(turn["per_token_logps"]) == len(turn["completion_token_ids"])
    return turn


def _text(vllm, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm.model_path).decode(ids)


def test_a_streamed_tool_call_is_parsed_by_vllm_and_captured(proxy, scripted_vllm):
    session_id, agent = _session(proxy[0], scripted_vllm)
    chunks = [
        c
        for c in agent.chat.completions.create(
            model="any", messages=MESSAGES, tools=TOOLS, stream=True, seed=0
        )
        if c.choices
    ]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in calls if c.function.name] == ["bash"]
    turn = _turn(proxy[0], session_id)
    assert turn["metadata"]["finish_reason"] == "tool_calls"
    assert _text(scripted_vllm, turn["completion_token_ids"]).startswith(SCRIPT)


def test_a_whole_reply_keeps_a_call_without_arguments_as_text(proxy, scripted_vllm):
    session_id, agent = _session(proxy[0], scripted_vllm)
    reply = agent.chat.completions.create(model="any", messages=MESSAGES, tools=TOOLS, seed=0)
    assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls
    assert reply.choices[0].message.content == SCRIPT
    assert _text(scripted_vllm, _turn(proxy[0], session_id)["completion_token_ids"]).startswith(SCRIPT)
