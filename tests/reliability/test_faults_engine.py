"""Engine faults seen through the capture proxy: the engine SIGKILLed mid-stream and mid-batch, and an
engine that answers 500s or malformed JSON. In every case the agent gets a clean OpenAI-style error,
the proxy stays up, the call is recorded as a transport failure (no token ids, so nothing half-written
can be trained on), the session becomes unscoreable (reward None, never 0) and its trace stays valid
with the failed turn flagged.

The killed engine is `engine.imitation`'s imitation of vLLM's server (vLLM needs a GPU) run as its
own process. The malformed engine is a tiny local HTTP server that answers exactly the bytes a test
gives it, since no real engine can be made to send them on purpose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest
from fastapi import FastAPI, Request
from starlette.responses import Response

from engine.in_process import serve_in_thread
from tests.proxy.conftest import ADMIN_KEY, Proxy, start_proxy
from tests.reliability.conftest import MODEL, EngineProcess, assert_turns_complete, wait_for

pytestmark = pytest.mark.timeout(180)

MESSAGES = [{"role": "user", "content": "write a long answer"}]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LONG = 20_000
"""Tokens in a stream that must still be running when the engine is killed (400 s at 0.02 s each)."""


@dataclass
class _Upstream:
    url: str


@pytest.fixture
def killable_proxy(engine_process, store) -> Iterator[Proxy]:
    app, server = start_proxy(_Upstream(engine_process.url), store)
    with server as url:
        yield Proxy(url, app.state.service, store)


def _assert_unscoreable(proxy: Proxy, session_id: str, *, good_turns: int = 0) -> None:
    """One transport-failure turn after `good_turns` complete ones; reward None; the trace is served
    (valid) with the failure flagged as a warning rather than refused or silently dropped."""
    assert assert_turns_complete(proxy.store, session_id) == good_turns + 1
    *good, failed = proxy.store.get_turns(session_id)
    assert all(t.metadata.capture == "ok" for t in good)
    assert failed.metadata.capture == "transport_error" and "engine" in failed.metadata.error
    record = proxy.store.get_session(session_id)
    assert record.error and record.reward is None
    trace = httpx.get(f"{proxy.url}/sessions/{session_id}/trace", headers=ADMIN, timeout=30)
    assert trace.status_code == 200, trace.text
    body = trace.json()
    assert body["reward"] is None and "engine" in body["metadata"]["error"]
    assert (
        body["turns"][-1]["loss_mask"] == [] and body["turns"][-1]["metadata"]["capture"] == "transport_error"
    )


def _proxy_serves_again(proxy: Proxy) -> None:
    """A new session's call is answered and stored once the engine is back (no dead pooled socket)."""
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=60)
    for stream in (False, True):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, stream=stream)
        if stream:
            assert [c for c in reply if c.choices]
        else:
            assert reply.choices[0].message.content
    assert assert_turns_complete(proxy.store, session.session_id) == 2


async def test_engine_killed_mid_stream(engine_process: EngineProcess, killable_proxy: Proxy):
    proxy = killable_proxy
    session = proxy.create()
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=60)
    # A complete call first: it must survive the crash untouched.
    first = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert first.choices[0].message.content

    engine_process.configure(completion_tokens=LONG, token_latency_s=0.02)
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = 0
    with pytest.raises(openai.APIError, match="engine") as err:
        async for _chunk in stream:
            received += 1
            if received == 5:
                engine_process.kill()
    assert received >= 5  # the agent got the tokens sent before the crash, then a clean error event
    assert "502" in str(err.value.body) or "upstream_error" in str(err.value.body)
    await client.close()

    assert httpx.get(f"{proxy.url}/health", timeout=10).status_code == 200
    _assert_unscoreable(proxy, session.session_id, good_turns=1)

    engine_process.start()  # a supervisor brings the engine back on its port
    _proxy_serves_again(proxy)


async def test_engine_killed_mid_batch(engine_process: EngineProcess, killable_proxy: Proxy):
    """12 calls in flight in 12 sessions (4 streams mid-token, 4 streams and 4 plain calls waiting on
    prefill) when the engine dies: each gets its own clean error and its own transport-failure turn."""
    proxy = killable_proxy
    sessions = [proxy.create() for _ in range(12)]
    clients = [
        openai.AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0, timeout=60)
        for s in sessions
    ]
    engine_process.configure(completion_tokens=LONG, token_latency_s=0.02)
    streaming_started = asyncio.Event()
    chunks = [0] * 4

    async def mid_token(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        try:
            async for _ in stream:
                chunks[i] += 1
                if min(chunks) >= 2:
                    streaming_started.set()
        except openai.APIError as exc:
            return f"stream-error: {exc}"
        return "finished"

    async def waiting(client: openai.AsyncOpenAI, stream: bool) -> str:
        try:
            reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=stream)
            if stream:
                async for _ in reply:
                    pass
        except openai.APIStatusError as exc:
            return f"status {exc.status_code}: {exc.message}"
        return "finished"

    calls = [asyncio.create_task(mid_token(c, i)) for i, c in enumerate(clients[:4])]
    await asyncio.wait_for(streaming_started.wait(), 60)
    engine_process.configure(latency_s=120)  # the next calls hang in prefill
    calls += [asyncio.create_task(waiting(c, stream=i % 2 == 0)) for i, c in enumerate(clients[4:])]
    await asyncio.to_thread(
        wait_for,
        lambda: len(httpx.get(f"{engine_process.url}/imitation/requests", timeout=10).json()) >= 12,
        60,
        "all 12 calls to reach the engine",
    )
    engine_process.kill()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls), 60)
    for client in clients:
        await client.close()

    assert all(o.startswith("stream-error") and "engine" in o for o in outcomes[:4]), outcomes
    assert all(o.startswith("status 502") and "engine" in o for o in outcomes[4:]), outcomes
    assert httpx.get(f"{proxy.url}/health", timeout=10).status_code == 200
    for session in sessions:
        _assert_unscoreable(proxy, session.session_id)

    engine_process.start()
    _proxy_serves_again(proxy)


# -- an engine that answers 500s and malformed JSON ---------------------------------------------


def _sse(*events: bytes) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events)


_GOOD_FIRST = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}],
        "prompt_token_ids": [1, 2, 3],
    }
)

BAD_REPLIES = {
    # name: (stream?, status, content type, body)
    "500_html": (False, 500, "text/html", b"<html><body>500 Internal Server Error</body></html>"),
    "500_stream": (True, 500, "application/json", b'{"error": {"message": "CUDA out of memory"}}'),
    "truncated_json": (False, 200, "application/json", b'{"id": "c1", "choices": [{"index": 0, "mess'),
    "not_an_object": (False, 200, "application/json", b'["choices"]'),
    "choices_not_objects": (False, 200, "application/json", b'{"choices": ["a", "b"], "prompt_token_ids": [1]}'),
    "second_choice_not_object": (
        False, 200, "application/json", b'{"choices": [{"index": 0, "message": {"content": "hi"}}, 5], "prompt_token_ids": [1]}',
    ),
    "token_ids_not_ints": (
        False, 200, "application/json",
        b'{"choices": [{"index": 0, "message": {"content": "hi"}, "token_ids": "ab", "logprobs": {"content": [{"token": "token_id:1", "logprob": "x"}]}}], "prompt_token_ids": {"a": 1}}',
    ),
    "garbage_event": (True, 200, "text/event-stream", _sse(b"{not json")),
    "garbage_after_good": (True, 200, "text/event-stream", _sse(_GOOD_FIRST, b"{not json")),
    "delta_not_object": (
        True, 200, "text/event-stream", _sse(_GOOD_FIRST, b'{"choices": [{"index": 0, "delta": "oops"}]}'),
    ),
    "logprob_entry_malformed": (
        True, 200, "text/event-stream",
        _sse(_GOOD_FIRST, b'{"choices": [{"index": 0, "delta": {}, "logprobs": {"content": [{"tok": 1}]}}]}'),
    ),
    "stream_token_ids_not_ints": (
        True, 200, "text/event-stream",
        _sse(_GOOD_FIRST, b'{"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": ["a"], "finish_reason": "stop"}]}', b"[DONE]"),
    ),
    "choices_not_a_list": (True, 200, "text/event-stream", _sse(b'{"choices": 7}')),
    # merged into the recorded reply only after [DONE]: it dropped the connection there
    "delta_content_not_a_string": (
        True, 200, "text/event-stream",
        _sse(_GOOD_FIRST, b'{"choices": [{"index": 0, "delta": {"content": 5}, "finish_reason": "stop"}]}', b"[DONE]"),
    ),
    "tool_arguments_not_a_string": (
        True, 200, "text/event-stream",
        _sse(_GOOD_FIRST, b'{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": [1]}}]}}]}', b"[DONE]"),
    ),
}  # fmt: skip


@pytest.fixture
def bad_engine() -> Iterator[tuple[str, dict]]:
    """Answers every sampling call with the configured status, content type and body."""
    app = FastAPI()
    reply: dict = {}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        await request.body()
        return Response(reply["body"], status_code=reply["status"], media_type=reply["type"])

    with serve_in_thread(app) as url:
        yield url, reply


@pytest.mark.parametrize("name", list(BAD_REPLIES))
def test_engine_500_or_malformed_reply_gets_502_and_no_turn(bad_engine, store, name):
    url, reply = bad_engine
    stream, status, content_type, body = BAD_REPLIES[name]
    reply.update(status=status, type=content_type, body=body)
    app, server = start_proxy(_Upstream(url), store)
    with server as proxy_url:
        proxy = Proxy(proxy_url, app.state.service, store)
        session = proxy.create()
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=60)
        with pytest.raises(openai.APIError, match="engine") as err:
            result = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=stream)
            if stream:
                list(result)
        if isinstance(err.value, openai.APIStatusError):
            assert err.value.status_code == 502
        assert httpx.get(f"{proxy_url}/health", timeout=10).status_code == 200
        _assert_unscoreable(proxy, session.session_id)
