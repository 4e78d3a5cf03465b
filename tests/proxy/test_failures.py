"""Bad input, bad keys and engine failures: the agent gets an OpenAI-style 4xx/5xx, the proxy stays up.

Upstream is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM needs a
GPU), with failures injected through its settings.
"""

from __future__ import annotations

import socket

import httpx
import openai
import orjson
import pytest

from tests.proxy.conftest import MODEL, Proxy, start_proxy

MESSAGES = [{"role": "user", "content": "hi"}]


def post(proxy: Proxy, key: str, body: bytes | dict, path: str = "chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(f"{proxy.url}/v1/{path}", content=content, headers={"Authorization": f"Bearer {key}"})


def assert_openai_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for word in words:
        assert word in error["message"]


BAD_INPUT = [
    (b"{not json", "not valid JSON", None),
    (b"[1, 2]", "JSON object", None),
    (orjson.dumps({"messages": MESSAGES}), "'model'", "model"),
    (orjson.dumps({"model": MODEL}), "'messages'", "messages"),
    (orjson.dumps({"model": MODEL, "messages": "hi"}), "'messages'", "messages"),
    (orjson.dumps({"model": MODEL, "messages": [{"content": "no role"}]}), "messages[0]", "messages[0]"),
    (orjson.dumps({"model": 3, "messages": MESSAGES}), "'model'", "model"),
    (
        orjson.dumps({"model": MODEL, "messages": MESSAGES, "temperature": "hot"}),
        "'temperature'",
        "temperature",
    ),
    (orjson.dumps({"model": MODEL, "messages": MESSAGES, "stream": "yes"}), "'stream'", "stream"),
    (orjson.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 1.5}), "'max_tokens'", "max_tokens"),
    (orjson.dumps({"model": MODEL, "messages": MESSAGES, "n": 2}), "'n'", "n"),
]


@pytest.mark.parametrize(("body", "says", "param"), BAD_INPUT)
def test_bad_input_gets_400_and_records_nothing(proxy, imitation, body, says, param):
    session = proxy.create()
    r = post(proxy, session.api_key, body)
    assert_openai_error(r, 400, says)
    assert r.json()["error"]["param"] == param
    assert proxy.store.get_session(session.session_id).num_turns == 0
    assert imitation.requests() == []
    assert httpx.get(f"{proxy.url}/health").status_code == 200


def test_completions_bad_prompt(proxy):
    session = proxy.create()
    assert_openai_error(post(proxy, session.api_key, {"model": MODEL}, "completions"), 400, "'prompt'")
    assert_openai_error(
        post(proxy, session.api_key, {"model": MODEL, "prompt": 5}, "completions"), 400, "'prompt'"
    )


def test_oversized_body_gets_413(imitation, store):
    app, server = start_proxy(imitation, store, max_body_bytes=64 * 1024)
    with server as url:
        proxy = Proxy(url, app.state.service, store)
        session = proxy.create()
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 100_000}]}
        assert_openai_error(post(proxy, session.api_key, big), 413, "65536")
        # Without a Content-Length the limit holds while the body streams in.
        chunks = (orjson.dumps(big)[i : i + 8192] for i in range(0, 110_000, 8192))
        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=chunks,
            headers={"Authorization": f"Bearer {session.api_key}"},
        )
        assert_openai_error(r, 413, "limit")
        assert store.get_session(session.session_id).num_turns == 0
        assert post(proxy, session.api_key, {"model": MODEL, "messages": MESSAGES}).status_code == 200


def test_unknown_session_key_gets_401_and_nothing_recorded(proxy, imitation):
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key="sk-harbor-not-a-session", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="unknown session key"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
    assert_openai_error(r, 401, "Authorization")
    assert imitation.requests() == []
    assert proxy.store.get_session(session.session_id).num_turns == 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_transport_failure(proxy: Proxy, session_id: str) -> None:
    (turn,) = proxy.store.get_turns(session_id)
    assert turn.metadata.capture == "transport_error"
    assert turn.metadata.error
    record = proxy.store.get_session(session_id)
    assert record.error and record.reward is None


@pytest.mark.parametrize("stream", [False, True])
def test_refused_upstream_gets_502_and_is_recorded(proxy, stream):
    session = proxy.create(llm_url=f"http://127.0.0.1:{_closed_port()}")
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=stream)
    assert err.value.status_code == 502
    _assert_transport_failure(proxy, session.session_id)
    info = httpx.get(f"{proxy.url}/sessions/{session.session_id}", headers=proxy.admin).json()
    assert "ConnectError" in info["metadata"]["error"]


def test_engine_5xx_gets_502(proxy, imitation):
    imitation.configure(fail="http_500")
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError, match="injected internal error") as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert err.value.status_code == 502
    _assert_transport_failure(proxy, session.session_id)


def test_engine_4xx_is_passed_on_and_not_recorded(proxy, imitation):
    imitation.configure(fail="http_400")
    session = proxy.create(max_model_calls=1)
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert proxy.store.get_session(session.session_id).num_turns == 0
    imitation.configure(fail=None)
    # The refused call did not spend the budget.
    assert (
        "budget"
        not in client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0].message.content
    )


def test_cut_reply_gets_502(proxy, imitation):
    imitation.configure(fail="cut")
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert err.value.status_code == 502
    _assert_transport_failure(proxy, session.session_id)


def test_stream_cut_before_first_event_gets_502(proxy, imitation):
    imitation.configure(fail="cut", fail_after_chunks=0)
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    assert err.value.status_code == 502
    _assert_transport_failure(proxy, session.session_id)


@pytest.mark.parametrize("fail", ["cut", "stream_error"])
async def test_stream_cut_midway_ends_with_error_event(proxy, imitation, fail):
    imitation.configure(fail=fail, fail_after_chunks=4)
    session = proxy.create()
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    received = 0
    with pytest.raises(openai.APIError, match="engine"):
        async for _ in await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True):
            received += 1
    assert received >= 3  # the agent saw the chunks before the cut
    await client.close()
    _assert_transport_failure(proxy, session.session_id)
    (turn,) = proxy.store.get_turns(session.session_id)
    assert turn.metadata.streamed is True


def test_engine_timeout_gets_504(imitation, store):
    imitation.configure(fail="hang", hang_s=3.0)
    app, server = start_proxy(imitation, store, read_timeout_s=0.5)
    with server as url:
        proxy = Proxy(url, app.state.service, store)
        session = proxy.create()
        client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert err.value.status_code == 504
        _assert_transport_failure(proxy, session.session_id)
