"""The real `openai` client through the running proxy; the store must hold exactly what the engine sent.

Upstream is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a
GPU); see tests/fixtures/vllm/ for its wire shapes.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.proxy.conftest import MODEL

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the bug."},
]


def engine_view(imitation, path: str, body: dict) -> dict:
    """What the engine answers the proxy's rewritten request (ids, logprobs) when called directly."""
    direct = {**body, "model": MODEL, "return_token_ids": True, "stream": False}
    direct["logprobs"] = True if path == "chat/completions" else 0
    if path == "chat/completions":
        direct["top_logprobs"] = 0
    return imitation.direct(path, direct)


def assert_turn_matches_engine(turn, engine: dict, endpoint: str) -> None:
    choice = engine["choices"][0]
    prompt = engine["prompt_token_ids"] if endpoint == "chat" else choice["prompt_token_ids"]
    if endpoint == "chat":
        logps = [c["logprob"] for c in choice["logprobs"]["content"]]
    else:
        logps = choice["logprobs"]["token_logprobs"]
    assert turn.prompt_token_ids == prompt
    assert turn.completion_token_ids == choice["token_ids"]
    assert turn.per_token_logps == logps
    assert turn.loss_mask == [0] * len(prompt) + [1] * len(choice["token_ids"])
    assert turn.metadata.capture == "ok"


def test_sync_chat_records_engine_tokens_and_enforces_train_sampling(proxy, imitation):
    imitation.configure(policy_version=7)
    session = proxy.create(sampling={"temperature": 0.6})
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model="whatever-the-agent-calls-it",
        messages=MESSAGES,
        temperature=0.1,
        top_p=0.5,
        presence_penalty=1.0,
    )
    assert reply.choices[0].message.content
    # vLLM-only fields the agent did not ask for are stripped.
    raw = reply.model_dump()
    assert "prompt_token_ids" not in raw and "token_ids" not in raw["choices"][0]
    assert reply.choices[0].logprobs is None

    sent = imitation.requests()[-1]
    assert sent["logprobs"] is True and sent["top_logprobs"] == 0 and sent["return_token_ids"] is True
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"]) == (0.6, 1.0, -1, 0.0)
    assert (sent["presence_penalty"], sent["frequency_penalty"], sent["repetition_penalty"]) == (
        0.0,
        0.0,
        1.0,
    )
    assert sent["model"] == MODEL

    (turn,) = proxy.store.get_turns(session.session_id)
    assert_turn_matches_engine(
        turn, engine_view(imitation, "chat/completions", {"messages": MESSAGES}), "chat"
    )
    assert turn.metadata.policy_version == 7
    assert turn.metadata.sampling["temperature"] == 0.6
    assert turn.metadata.finish_reason == "stop" and turn.metadata.streamed is False
    assert turn.request["messages"] == MESSAGES
    assert turn.response["choices"][0]["message"]["content"] == reply.choices[0].message.content


async def test_async_streamed_tool_calls_then_trace(proxy, imitation):
    session = proxy.create(multi_step_task=True)
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    name, args, call_id, finish, usage, chunks = "", "", None, None, None, 0
    async for chunk in stream:
        chunks += 1
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or ():
                call_id = tc.id or call_id
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert chunks > 10  # relayed chunk by chunk, not buffered into one
    assert (name, args, finish) == ("bash", '{"command":"echo hello"}', "tool_calls")

    (turn,) = proxy.store.get_turns(session.session_id)
    assert_turn_matches_engine(
        turn, engine_view(imitation, "chat/completions", {"messages": MESSAGES, "tools": TOOLS}), "chat"
    )
    assert usage.completion_tokens == len(turn.completion_token_ids)
    assert turn.metadata.streamed is True
    assert turn.response["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": name,
        "arguments": args,
    }

    # Second turn: the tool result goes back; its prompt extends the first turn's tokens exactly.
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "hello"},
    ]  # fmt: skip
    reply = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert reply.choices[0].message.tool_calls
    turns = proxy.store.get_turns(session.session_id)
    assert len(turns) == 2
    first, second = turns
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.completion_token_ids)] == (
        first.prompt_token_ids + first.completion_token_ids
    )
    await client.close()

    r = httpx.get(f"{proxy.url}/sessions/{session.session_id}/trace", headers=proxy.admin)
    assert r.status_code == 200, r.text
    trace = r.json()
    assert [t["node_id"] for t in trace["turns"]] == [first.node_id, second.node_id]
    assert trace["turns"][1]["metadata"]["parent_node_id"] == first.node_id
    assert trace["turns"][1]["loss_mask"] == second.loss_mask


@pytest.mark.parametrize("stream", [False, True])
def test_top_logprobs_list_alternatives_for_every_token(proxy, stream):
    # Found by the schema fuzzer: a tool named with a 4-byte character puts its lead byte near the end
    # of the imitation's vocabulary, and the alternatives after it wrapped round to ids it could not
    # decode (the engine answered 500, the proxy 502).
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "\U00010000", "parameters": {"type": "object"}}}]
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=tools, logprobs=True, top_logprobs=20, stream=stream
    )
    chunks = list(reply) if stream else [reply]
    entries = [e for chunk in chunks for c in chunk.choices if c.logprobs for e in c.logprobs.content or ()]
    assert entries and all(len(e.top_logprobs) == 20 for e in entries)
    assert proxy.store.get_session(session.session_id).num_turns == 1


def test_sync_stream_asking_for_logprobs_keeps_them(proxy, imitation):
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, logprobs=True)
    text, logps = "", []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                logps += [c.logprob for c in choice.logprobs.content]
    (turn,) = proxy.store.get_turns(session.session_id)
    assert turn.per_token_logps == logps
    assert turn.response["choices"][0]["message"]["content"] == text
    assert_turn_matches_engine(
        turn, engine_view(imitation, "chat/completions", {"messages": MESSAGES}), "chat"
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_endpoint(proxy, imitation, stream):
    session = proxy.create()
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    if stream:
        text = ""
        async for chunk in await client.completions.create(model=MODEL, prompt="def add(a, b):", stream=True):
            text += chunk.choices[0].text if chunk.choices else ""
    else:
        text = (await client.completions.create(model=MODEL, prompt="def add(a, b):")).choices[0].text
    await client.close()
    (turn,) = proxy.store.get_turns(session.session_id)
    engine = engine_view(imitation, "completions", {"prompt": "def add(a, b):"})
    assert text == engine["choices"][0]["text"]
    assert_turn_matches_engine(turn, engine, "completions")
    assert turn.metadata.endpoint == "completions"


def test_models_route(proxy):
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]


def test_eval_session_passes_sampling_and_records_text_without_ids(proxy, imitation):
    imitation.configure(fail="no_token_ids")
    session = proxy.create(purpose="eval")
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0.3, top_p=0.5, max_tokens=5
    )
    sent = imitation.requests()[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.3, 0.5, 5)
    assert "top_k" not in sent
    (turn,) = proxy.store.get_turns(session.session_id)
    assert turn.metadata.capture == "missing_token_ids"
    assert not any(turn.loss_mask)
    assert turn.response["choices"][0]["message"]["content"] == reply.choices[0].message.content
    assert turn.metadata.finish_reason == "length"


def test_eval_session_applies_only_the_sampling_its_creator_set(proxy, imitation):
    # `harbor eval --temperature 0.2 --max-tokens 4`: those two win over the agent's; the rest is its own.
    session = proxy.create(purpose="eval", sampling={"temperature": 0.2, "max_tokens": 4})
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0.9, top_p=0.5, max_tokens=50)
    sent = imitation.requests()[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.2, 0.5, 4)
    assert "top_k" not in sent and "seed" not in sent


def test_token_id_mismatch_marks_capture_and_trace_refuses(proxy, imitation):
    imitation.configure(fail="token_mismatch")
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES)
    (turn,) = proxy.store.get_turns(session.session_id)
    assert turn.metadata.capture == "token_mismatch"
    assert "token_id:" in turn.metadata.error
    r = httpx.get(f"{proxy.url}/sessions/{session.session_id}/trace", headers=proxy.admin)
    assert r.status_code == 409
    assert any(f["severity"] == "FATAL" for f in r.json()["findings"])


@pytest.mark.parametrize("stream", [False, True])
def test_step_budget_answers_terminal_message_and_records_nothing(proxy, stream):
    session = proxy.create(max_model_calls=2)
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES)
        text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert "budget" in text and "2 calls" in text
    assert finish == "stop"
    assert len(proxy.store.get_turns(session.session_id)) == 2


def test_admin_lifecycle(proxy):
    session = proxy.create(metadata={"task": "t1"})
    r = httpx.get(f"{proxy.url}/sessions", headers=proxy.admin)
    assert [s["session_id"] for s in r.json()] == [session.session_id]
    info = httpx.get(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin).json()
    assert (info["status"], info["metadata"], info["llm_url"].endswith("/v1")) == (
        "running",
        {"task": "t1"},
        True,
    )
    assert session.base_url == f"{proxy.url}/v1"

    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES)
    r = httpx.delete(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin)
    assert r.json()["status"] == "completed" and r.json()["num_turns"] == 1
    with pytest.raises(openai.ConflictError, match="completed"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    trace = httpx.get(f"{proxy.url}/sessions/{session.session_id}/trace", headers=proxy.admin).json()
    assert len(trace["turns"]) == 1 and trace["status"] == "completed"

    assert httpx.get(f"{proxy.url}/sessions", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(f"{proxy.url}/sessions/unknown", headers=proxy.admin).status_code == 404
    bad = httpx.post(f"{proxy.url}/sessions", json={"model": MODEL, "purpose": "play"}, headers=proxy.admin)
    assert bad.status_code == 422 and "purpose" in bad.json()["error"]["message"]


def test_llm_url_accepted_with_or_without_v1(proxy, imitation):
    for url in (imitation.url, imitation.url + "/v1", imitation.url + "/v1/"):
        session = proxy.create(llm_url=url)
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        assert client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content


def test_health_and_metrics(proxy):
    assert httpx.get(f"{proxy.url}/health").json()["status"] == "ok"
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES)
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'harbor_proxy_requests_total{endpoint="chat",status="200"} 1' in text
    assert 'harbor_proxy_turns_total{endpoint="chat",capture="ok"} 1' in text
    assert 'harbor_proxy_call_latency_seconds_count{endpoint="chat"} 1' in text


def test_closed_session_key_answers_409_and_leaves_the_key_cache(proxy):
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert proxy.service.live_sessions == 1
    r = httpx.delete(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin)
    assert r.status_code == 200, r.text
    assert proxy.service.live_sessions == 0  # a run of days does not keep every key in memory
    for _ in range(2):  # found again in the store, still refused, and not cached again
        with pytest.raises(openai.ConflictError, match="completed"):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert proxy.service.live_sessions == 0


@pytest.mark.parametrize("stream", [False, True])
def test_eval_against_an_openai_api_that_refuses_vllm_fields(proxy, imitation, stream):
    """The imitation answers as api.openai.com does to `return_token_ids`: 400, unrecognized argument."""
    imitation.configure(openai_strict=True)
    session = proxy.create(purpose="eval")
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    for _ in range(2):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=stream)
        if stream:
            assert "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        else:
            assert reply.choices[0].message.content
    sent = imitation.requests()
    # Refused once, sent again without it, and the next call leaves it out from the start.
    assert ["return_token_ids" in body for body in sent] == [True, False, False]
    turns = proxy.store.get_turns(session.session_id)
    assert [t.metadata.capture for t in turns] == ["missing_token_ids"] * 2


def test_train_session_still_refuses_an_engine_without_token_ids(proxy, imitation):
    imitation.configure(openai_strict=True)
    session = proxy.create(purpose="train")
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="return_token_ids"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert len(imitation.requests()) == 1
