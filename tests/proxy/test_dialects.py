"""Anthropic's Messages API and OpenAI's Responses API through the running proxy, driven by the real
`anthropic` and `openai` SDKs: their clients parse every reply and stream (their stream helpers check
event order and item identities), and each turn is the engine's own chat capture.

Upstream is `engine.imitation` (vLLM's wire format; its "model" always calls an offered tool), so the
tool-calling exchanges are deterministic. tests/proxy/test_dialects_engine.py repeats the exchanges on
the embedded engine itself.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest

from capture_proxy.dialects import ANTHROPIC_MESSAGES, OPENAI_RESPONSES
from capture_proxy.dialects.bridge import _translated
from capture_proxy.validation import validate_trace
from tests.proxy.conftest import MODEL

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
RESPONSES_BASH = {
    "type": "function",
    "name": "bash",
    "description": BASH["description"],
    "parameters": BASH["input_schema"],
}
SYSTEM = "You are a coding agent."


def anthropic_client(proxy, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0)


def openai_client(session) -> openai.OpenAI:
    return openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)


def trace_of(proxy, session_id: str) -> dict:
    reply = httpx.get(f"{proxy.url}/sessions/{session_id}/trace", headers=proxy.admin)
    assert reply.status_code == 200, reply.text
    trace = reply.json()
    assert [f for f in validate_trace(trace) if f.severity == "FATAL"] == []
    return trace


def assert_engine_capture(imitation, turn: dict) -> None:
    """The turn holds what the engine answers its recorded chat request, token for token."""
    request = turn["request"]
    direct = {
        **{k: v for k, v in request.items() if k not in ("stream", "stream_options")},
        "model": MODEL,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    engine = imitation.direct("chat/completions", direct)
    choice = engine["choices"][0]
    assert turn["prompt_token_ids"] == engine["prompt_token_ids"]
    assert turn["completion_token_ids"] == choice["token_ids"]
    assert turn["per_token_logps"] == [c["logprob"] for c in choice["logprobs"]["content"]]
    n_prompt = len(turn["prompt_token_ids"])
    assert turn["loss_mask"] == [0] * n_prompt + [1] * len(choice["token_ids"])
    assert turn["metadata"]["capture"] == "ok"


# -- Anthropic Messages ------------------------------------------------------------------------------


def test_messages_tool_exchange_streamed_and_not_is_captured_as_chat(proxy, imitation):
    session = proxy.create(multi_step_task=True)
    client = anthropic_client(proxy, session.api_key)
    messages = [{"role": "user", "content": [{"type": "text", "text": "List the files."}]}]

    first = client.messages.create(
        model="claude-sonnet", max_tokens=300, system=SYSTEM, messages=messages, tools=[BASH]
    )
    assert first.type == "message" and first.role == "assistant" and first.model == "claude-sonnet"
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "bash" and call.input == {"command": "echo hello"}
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "README.md\n"}],
        },
    ]
    with client.messages.stream(
        model="claude-sonnet",
        max_tokens=300,
        system=[{"type": "text", "text": SYSTEM}],
        messages=messages,
        tools=[BASH],
    ) as stream:
        kinds = [event.type for event in stream]
        second = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert second.stop_reason == "tool_use" and second.content[0].type == "tool_use"
    assert second.content[0].input == {"command": "echo hello"}
    assert second.usage.input_tokens > first.usage.input_tokens

    turns = trace_of(proxy, session.session_id)["turns"]
    assert len(turns) == 2
    for turn in turns:
        assert turn["metadata"]["dialect"] == "anthropic-messages"
        assert_engine_capture(imitation, turn)
    assert [turn["metadata"]["streamed"] for turn in turns] == [False, True]
    # The recorded request is the chat call the engine got: system first, the tool result as a tool message.
    chat = turns[1]["request"]["messages"]
    assert chat[0] == {"role": "system", "content": SYSTEM}
    assert chat[2]["tool_calls"][0]["id"] == call.id
    assert chat[3] == {"role": "tool", "tool_call_id": call.id, "content": "README.md\n"}
    # The replayed call renders as the engine wrote it, so the second call extends the first.
    assert turns[1]["metadata"]["parent_node_id"] == turns[0]["node_id"]
    assert turns[1]["prompt_token_ids"][: len(turns[0]["prompt_token_ids"])] == turns[0]["prompt_token_ids"]


def test_messages_text_reply_streams_text_deltas(proxy, imitation):
    session = proxy.create()
    client = anthropic_client(proxy, session.api_key)
    with client.messages.stream(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn"
    plain = client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert plain.stop_reason == "max_tokens" and plain.usage.output_tokens == 4
    turns = trace_of(proxy, session.session_id)["turns"]
    assert turns[0]["response"]["choices"][0]["message"]["content"] == text


def test_messages_accepts_the_key_as_bearer_too(proxy):
    session = proxy.create()
    client = anthropic.Anthropic(base_url=proxy.url, auth_token=session.api_key, max_retries=0)
    reply = client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].type == "text"


def test_messages_errors_come_back_in_anthropics_shape(proxy, imitation):
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        anthropic_client(proxy, "not-a-key").messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert bad_key.value.body["type"] == "error"
    assert bad_key.value.body["error"]["type"] == "authentication_error"

    session = proxy.create()
    raw = httpx.post(
        f"{proxy.url}/v1/messages",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": session.api_key},
    )
    assert raw.status_code == 400
    assert raw.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "'max_tokens' is required",
        },
    }
    client = anthropic_client(proxy, session.api_key)
    with pytest.raises(anthropic.BadRequestError, match="server tool 'web_search_20250305' is not supported"):
        client.messages.create(
            model="m",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\].content\[0\]"):
        client.messages.create(
            model="m",
            max_tokens=10,
            messages=[
                {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}
            ],
        )
    assert (
        httpx.get(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin).json()["num_turns"] == 0
    )

    imitation.configure(fail="http_500")
    with pytest.raises(anthropic.InternalServerError) as failed:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 502 and failed.value.body["error"]["type"] == "api_error"


def test_messages_stream_failing_midway_ends_with_an_error_event(proxy, imitation):
    session = proxy.create()
    imitation.configure(fail="cut", fail_after_chunks=4)
    client = anthropic_client(proxy, session.api_key)
    with (
        pytest.raises(anthropic.APIStatusError, match="engine"),
        client.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        list(stream)
    turns = httpx.get(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin).json()
    assert turns["num_turns"] == 1  # the failed call is recorded as a transport failure


@pytest.mark.parametrize("stream", [False, True])
def test_messages_step_budget_answers_a_final_message(proxy, stream):
    session = proxy.create(max_model_calls=1)
    client = anthropic_client(proxy, session.api_key)
    messages = [{"role": "user", "content": "hi"}]
    client.messages.create(model="m", max_tokens=20, messages=messages)
    if stream:
        with client.messages.stream(model="m", max_tokens=20, messages=messages) as s:
            final = s.get_final_message()
    else:
        final = client.messages.create(model="m", max_tokens=20, messages=messages)
    assert final.stop_reason == "end_turn" and "budget" in final.content[0].text


# -- OpenAI Responses --------------------------------------------------------------------------------


def test_responses_function_call_exchange_streamed_and_not_is_captured_as_chat(proxy, imitation):
    session = proxy.create(multi_step_task=True)
    client = openai_client(session)
    conversation: list = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "List the files."},
    ]

    first = client.responses.create(
        model="gpt-x", instructions=SYSTEM, input=conversation, tools=[RESPONSES_BASH]
    )
    assert first.object == "response" and first.status == "completed" and first.model == "gpt-x"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "bash" and call.arguments
    assert (
        first.usage.input_tokens > 0
        and first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    )

    conversation += [item.model_dump(exclude_none=True) for item in first.output]
    conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "README.md\n"})
    with client.responses.stream(
        model="gpt-x", instructions=SYSTEM, input=conversation, tools=[RESPONSES_BASH]
    ) as stream:
        events = [event for event in stream]
        second = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.function_call_arguments.done" in kinds and "response.output_item.done" in kinds
    (streamed_call,) = [item for item in second.output if item.type == "function_call"]
    assert streamed_call.name == "bash" and streamed_call.arguments == call.arguments

    turns = trace_of(proxy, session.session_id)["turns"]
    assert len(turns) == 2
    for turn in turns:
        assert turn["metadata"]["dialect"] == "openai-responses"
        assert_engine_capture(imitation, turn)
    chat = turns[1]["request"]["messages"]
    assert [m["role"] for m in chat] == ["system", "system", "user", "assistant", "tool"]
    assert chat[3]["tool_calls"][0]["function"]["arguments"] == call.arguments
    assert turns[1]["metadata"]["parent_node_id"] == turns[0]["node_id"]


def test_responses_text_reply_and_token_limit(proxy):
    session = proxy.create()
    client = openai_client(session)
    with client.responses.stream(model="m", input="hi") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) != ""
    cut = client.responses.create(model="m", input="hi", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_responses_errors_come_back_in_openais_shape(proxy, imitation):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="nope", max_retries=0).responses.create(
            model="m", input="hi"
        )
    session = proxy.create()
    client = openai_client(session)
    with pytest.raises(openai.BadRequestError, match="previous_response_id") as refused:
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model="m", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]"):
        client.responses.create(model="m", input=[{"type": "item_reference", "id": "x"}])

    imitation.configure(fail="stream_error", fail_after_chunks=3)
    with client.responses.stream(model="m", input="hi") as stream:
        last = [event for event in stream][-1]
    assert last.type == "response.failed" and last.response.status == "failed"
    assert "engine" in last.response.error.message


def test_responses_namespaced_tools_are_offered_flat_and_answered_with_their_namespace(proxy):
    # codex groups its sub-agent tools in a `namespace` tool; the engine sees the functions themselves.
    session = proxy.create()
    namespace = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{**RESPONSES_BASH, "name": "close_agent"}],
    }
    reply = openai_client(session).responses.create(model="m", input="hi", tools=[namespace])
    (call,) = reply.output
    assert call.type == "function_call" and call.name == "close_agent" and call.namespace == "multi_agent_v1"
    turn = trace_of(proxy, session.session_id)["turns"][0]
    assert [t["function"]["name"] for t in turn["request"]["tools"]] == ["close_agent"]


def test_messages_input_sent_back_with_schema_defaults_still_extends_the_last_call(proxy, imitation):
    # Claude Code sends a tool call back with its schema's defaults filled in (Edit's "replace_all": false
    # where the engine wrote none): the same call, so the next prompt must still extend the last one.
    tool = {**BASH, "input_schema": {**BASH["input_schema"], "properties": {
        "command": {"type": "string"}, "background": {"type": "boolean", "default": False}}}}  # fmt: skip
    session = proxy.create(multi_step_task=True)
    client = anthropic_client(proxy, session.api_key)
    messages = [{"role": "user", "content": [{"type": "text", "text": "List the files."}]}]
    first = client.messages.create(model="claude-sonnet", max_tokens=300, system=SYSTEM, messages=messages,
                                   tools=[tool])  # fmt: skip
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert call.input == {"command": "echo hello"}
    echoed = [b.model_dump(exclude_none=True) for b in first.content]
    for block in echoed:
        if block["type"] == "tool_use":
            block["input"] = {**block["input"], "background": False}
    messages += [
        {"role": "assistant", "content": echoed},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "README.md\n"}],
        },
    ]
    client.messages.create(
        model="claude-sonnet", max_tokens=300, system=SYSTEM, messages=messages, tools=[tool]
    )
    # A value other than the default is a different call: it is rendered as sent, and opens a new root.
    echoed[-1]["input"] = {"command": "echo hello", "background": True}
    client.messages.create(
        model="claude-sonnet", max_tokens=300, system=SYSTEM, messages=messages, tools=[tool]
    )

    turns = trace_of(proxy, session.session_id)["turns"]
    assert len(turns) == 3
    assert turns[1]["metadata"]["parent_node_id"] == turns[0]["node_id"]
    assert '"background"' not in turns[1]["request"]["messages"][2]["tool_calls"][0]["function"]["arguments"]
    assert turns[2]["metadata"]["parent_node_id"] is None
    assert (
        '"background": true' in turns[2]["request"]["messages"][2]["tool_calls"][0]["function"]["arguments"]
    )


# -- streams that fail mid-way -----------------------------------------------------------------------

STREAMED = {
    "messages": {"model": "m", "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "stream": True, "input": "hi"},
}  # fmt: skip


def sse_events(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each event of a whole SSE body."""
    events = []
    for block in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], orjson.loads(lines["data"])))
    return events


@pytest.mark.parametrize("fail", ["cut", "stream_error"])
@pytest.mark.parametrize("route", ["messages", "responses"])
def test_a_stream_failing_midway_ends_with_the_dialects_error_event_and_closes_cleanly(
    proxy, imitation, route, fail
):
    session = proxy.create()
    imitation.configure(fail=fail, fail_after_chunks=4)
    headers = {"Authorization": f"Bearer {session.api_key}"}
    with httpx.stream("POST", f"{proxy.url}/v1/{route}", json=STREAMED[route], headers=headers) as reply:
        body = reply.read()  # a dropped connection raises here (an incomplete chunked body)
    assert reply.status_code == 200
    events = sse_events(body)
    name, data = events[-1]
    if route == "messages":
        assert (
            name == "error" and data["error"]["type"] == "api_error" and "engine" in data["error"]["message"]
        )
        assert [n for n, _ in events][:3] == ["message_start", "content_block_start", "ping"]
    else:
        assert name == "response.failed" and data["response"]["status"] == "failed"
        assert "engine" in data["response"]["error"]["message"]
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    (turn,) = proxy.store.get_turns(session.session_id)
    assert turn.metadata.capture == "transport_error" and turn.metadata.streamed
    imitation.configure(fail=None)
    again = httpx.post(f"{proxy.url}/v1/{route}", json={**STREAMED[route], "stream": False}, headers=headers)
    assert again.status_code == 200, again.text


@pytest.mark.parametrize("dialect", [ANTHROPIC_MESSAGES, OPENAI_RESPONSES], ids=lambda d: d.name)
async def test_a_translation_failing_midway_still_ends_with_the_error_event(dialect):
    # A chunk the translator cannot read (the chat relay lets no such chunk through; this is the net
    # under a translation bug): the chat stream is still read to its end, then the error event goes out.
    body = STREAMED["messages" if dialect is ANTHROPIC_MESSAGES else "responses"]
    read: list[bytes] = []

    async def chat_stream():
        for event in (
            b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"function": "f"}]}}]}',
            b"[DONE]",
        ):
            read.append(event)
            yield b"data: " + event + b"\n\n"

    stream = dialect.stream(dialect.parse(body))
    out = b"".join([piece async for piece in _translated(chat_stream(), stream)])
    name, data = sse_events(out)[-1]
    assert name in ("error", "response.failed")
    assert "could not translate the engine's stream" in orjson.dumps(data).decode()
    assert read[-1] == b"[DONE]"


# -- bad values, refused naming their field ----------------------------------------------------------

_MESSAGE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
_RESPONSE = {"model": "m", "input": "hi"}


def _user(content) -> dict:
    return {**_MESSAGE, "messages": [{"role": "user", "content": content}]}


BAD_VALUES = [
    # (route, body, the field named, words of the message)
    ("messages", _user([{"type": "text", "text": 5}]), "messages[0].content[0].text", "must be a string"),
    ("messages", _user(5), "messages[0].content", "must be a string or an array"),
    ("messages", {**_MESSAGE, "messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role",
     "must be 'user', 'assistant' or 'system'"),
    ("messages", {**_MESSAGE, "tools": [{"name": "t", "input_schema": {"properties": []}}]},
     "tools[0].input_schema.properties", "must be an object"),
    ("messages", {**_MESSAGE, "tool_choice": {"type": "tool"}}, "tool_choice.name", "is required"),
    ("messages", {**_MESSAGE, "top_k": 2**63}, "top_k", "less than or equal to"),
    ("responses", {**_RESPONSE, "input": [{"role": "user", "content": [{"type": "input_text", "text": [1]}]}]},
     "input[0].content[0].text", "must be a string"),
    ("responses", {**_RESPONSE, "input": [{"type": [1]}]}, "input[0].type", "must be a string"),
    ("responses", {**_RESPONSE, "tools": [{"type": "web_search"}]}, "tools[0]", "is not supported"),
    ("responses", {**_RESPONSE, "tool_choice": {"type": "file_search"}}, "tool_choice", "is not supported"),
    ("responses", {**_RESPONSE, "metadata": {"run": 5}}, "metadata.run", "must be a string"),
    ("responses", {**_RESPONSE, "max_output_tokens": 2**63}, "max_output_tokens", "less than or equal to"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "field", "words"), BAD_VALUES)
def test_a_bad_value_is_refused_in_the_dialects_shape_naming_its_field(
    proxy, imitation, route, body, field, words
):
    session = proxy.create()
    headers = {"Authorization": f"Bearer {session.api_key}"}
    reply = httpx.post(f"{proxy.url}/v1/{route}", content=orjson.dumps(body), headers=headers)
    assert reply.status_code == 400, reply.text
    if route == "messages":  # Anthropic's errors carry no param: the message names the field
        error = reply.json()["error"]
        assert reply.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        error = reply.json()["error"]
        assert error["param"] == field
    assert field in error["message"] and words in error["message"], error["message"]
    assert imitation.requests() == []
    assert proxy.store.get_session(session.session_id).num_turns == 0
