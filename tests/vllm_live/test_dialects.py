"""The Anthropic Messages and OpenAI Responses dialects through the capture proxy in front of the live
vLLM, driven by the real SDKs (`anthropic`, `openai`): the proxy translates each call to a vLLM chat call
(capture_proxy/dialects/), and what it stores is what vLLM sampled. Each conversation carries a tool and a
tool call with its result, so the translation of tools, tool_use/function_call and their results into
vLLM's chat template is checked too. Every stored turn is replayed directly against vLLM with the chat
body the proxy recorded and the session's seed: the ids and logprobs must be equal.

The tiny random model writes no tool call of its own; a reply's tool_use is checked with the scripted
model against the embedded engine (tests/proxy/test_dialects_engine.py). A stop sequence here is one the
model really wrote, so vLLM's `stop_reason` (the matched string) reaches the agent as Anthropic's
`stop_sequence`."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from capture_proxy.app import create_app as create_proxy_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from capture_proxy.validation import validate_trace
from engine.in_process import serve_in_thread

pytestmark = pytest.mark.timeout(900)  # the module's first test may wait for vLLM's start
ADMIN = "vllm-live-dialects-admin-key"
SAMPLING = {"temperature": 0.9, "seed": 5}
"""A train session's policy: the seed makes vLLM's sampling repeatable, so a direct call can replay it."""
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    store = TraceStore(f"sqlite:///{tmp_path_factory.mktemp('proxy-dialects')}/traces.db")
    with serve_in_thread(create_proxy_app(ProxyConfig(admin_key=ADMIN), store), log_level="warning") as url:
        yield url
    store.close()


def _session(proxy: str, vllm, multi_step: bool = False) -> dict:
    spec = {"llm_url": vllm.url, "model": vllm.served_model_name, "multi_step_task": multi_step,
            "sampling": SAMPLING}  # fmt: skip
    reply = httpx.post(f"{proxy}/sessions", json=spec, headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 201, reply.text
    return reply.json()


def _turns_as_vllm_sampled_them(proxy: str, vllm, session_id: str, dialect: str) -> list[dict]:
    """The session's turns, each checked: the trace validates, and a direct vLLM call with the recorded
    chat body and sampling returns the stored prompt ids, completion ids and logprobs exactly."""
    reply = httpx.get(f"{proxy}/sessions/{session_id}/trace", headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 200, reply.text
    trace = reply.json()
    assert [f for f in validate_trace(trace) if f.severity == "FATAL"] == []
    for turn in trace["turns"]:
        assert turn["metadata"]["capture"] == "ok" and turn["metadata"]["dialect"] == dialect
        assert turn["metadata"]["sampling"]["seed"] == SAMPLING["seed"]
        request = {k: v for k, v in turn["request"].items() if k not in ("stream", "stream_options")}
        body = {**request, **turn["metadata"]["sampling"], "model": vllm.served_model_name, "logprobs": True,
                "top_logprobs": 0, "return_token_ids": True}  # fmt: skip
        direct = httpx.post(f"{vllm.v1}/chat/completions", json=body, timeout=120)
        assert direct.status_code == 200, direct.text
        choice = direct.json()["choices"][0]
        assert turn["prompt_token_ids"] == direct.json()["prompt_token_ids"]
        assert turn["completion_token_ids"] == choice["token_ids"]
        assert turn["per_token_logps"] == [e["logprob"] for e in choice["logprobs"]["content"]]
        assert turn["metadata"]["finish_reason"] == choice["finish_reason"]
    return trace["turns"]


def _rendered(vllm, turn: dict) -> str:
    """The prompt vLLM saw, as text (its tokenizer's decode through the /detokenize route)."""
    reply = httpx.post(
        f"{vllm.url}/detokenize", json={"model": vllm.served_model_name, "tokens": turn["prompt_token_ids"]}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["prompt"]


def test_anthropic_messages_create_and_stream(proxy, vllm):
    session = _session(proxy, vllm, multi_step=True)
    client = anthropic.Anthropic(base_url=proxy, api_key=session["api_key"], max_retries=0)
    tools = [{"name": "bash", "description": "Run a shell command.", "input_schema": SCHEMA}]
    messages = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash",
                                           "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "README.md\nsetup.py"}]},
    ]  # fmt: skip
    first = client.messages.create(
        model="claude", max_tokens=8, system="You are a coding agent.", messages=messages, tools=tools
    )
    assert first.stop_reason in ("max_tokens", "end_turn") and first.content[0].type == "text"
    messages += [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "Now run the tests."},
    ]
    with client.messages.stream(
        model="claude", max_tokens=8, system="You are a coding agent.", messages=messages, tools=tools
    ) as stream:
        streamed_text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert second.content[0].text == streamed_text and second.usage.output_tokens > 0

    one, two = _turns_as_vllm_sampled_them(proxy, vllm, session["session_id"], "anthropic-messages")
    assert not one["metadata"]["streamed"] and two["metadata"]["streamed"]
    assert first.usage.output_tokens == len(one["completion_token_ids"])
    # vLLM's chat template got the tool schema, the call and its result as the tiny (Qwen2.5) template
    # renders them.
    shown = _rendered(vllm, one)
    assert '"name": "bash"' in shown and "<tool_call>" in shown
    assert "<tool_response>\nREADME.md\nsetup.py\n</tool_response>" in shown
    assert shown.startswith("<|im_start|>system\nYou are a coding agent.")
    assert _rendered(vllm, two).endswith("Now run the tests.<|im_end|>\n<|im_start|>assistant\n")


def test_anthropic_stop_sequence_is_the_string_vllm_matched(proxy, vllm):
    """A string the seeded model writes, asked as a stop sequence: vLLM stops there and names it
    (`stop_reason`), and the agent gets Anthropic's `stop_sequence` and the text before it."""
    messages = [{"role": "user", "content": "Say something."}]
    free = _session(proxy, vllm)
    client = anthropic.Anthropic(base_url=proxy, api_key=free["api_key"], max_retries=0)
    text = client.messages.create(model="claude", max_tokens=12, messages=messages).content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop.strip()) == 3, text  # a mid-text piece the model wrote
    stopped = _session(proxy, vllm)
    client = anthropic.Anthropic(base_url=proxy, api_key=stopped["api_key"], max_retries=0)
    reply = client.messages.create(model="claude", max_tokens=12, messages=messages, stop_sequences=[stop])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    assert reply.content[0].text == text[: text.index(stop)]
    (turn,) = _turns_as_vllm_sampled_them(proxy, vllm, stopped["session_id"], "anthropic-messages")
    assert turn["request"]["stop"] == [stop] and turn["metadata"]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_responses(proxy, vllm, stream):
    session = _session(proxy, vllm)
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    tools = [
        {"type": "function", "name": "bash", "description": "Run a shell command.", "parameters": SCHEMA}
    ]
    conversation = [
        {"role": "user", "content": "List the files."},
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsetup.py"},
    ]
    kwargs = {"model": "gpt", "instructions": "You are a coding agent.", "input": conversation,
              "tools": tools, "max_output_tokens": 8}  # fmt: skip
    if stream:
        # A reply cut at max_output_tokens ends in `response.incomplete`, not `response.completed`, which
        # is all the SDK's `get_final_response` waits for: read the events.
        events = list(client.responses.create(stream=True, **kwargs))
        assert events[-1].type == "response.incomplete"
        reply = events[-1].response
        assert reply.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    else:
        reply = client.responses.create(**kwargs)
    assert [item.type for item in reply.output] == ["message"] and reply.output_text
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"

    (turn,) = _turns_as_vllm_sampled_them(proxy, vllm, session["session_id"], "openai-responses")
    assert turn["metadata"]["streamed"] is stream
    assert reply.usage.output_tokens == len(turn["completion_token_ids"]) == 8
    shown = _rendered(vllm, turn)
    assert shown.startswith("<|im_start|>system\nYou are a coding agent.")
    assert '{"name": "bash", "arguments": {"command": "ls"}}' in shown
    assert "<tool_response>\nREADME.md\nsetup.py\n</tool_response>" in shown
