"""The engine's credential: a session's `api_key` goes upstream as `Authorization: Bearer` (vLLM's
`--api-key`), or in the header its `auth_header` names (OpenEnv's factory keyword, for gateways), and a
missing one is the engine's refusal, not a silent success. Upstream is `engine.imitation` (vLLM needs a GPU)
with its key check on."""

from __future__ import annotations

import openai
import pytest

from tests.proxy.conftest import MODEL

MESSAGES = [{"role": "user", "content": "hello"}]


def _ask(session) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    return client.chat.completions.create(model=MODEL, messages=MESSAGES)


def test_the_key_goes_upstream_as_bearer_by_default(proxy, imitation):
    imitation.configure(api_key="engine-secret")
    session = proxy.create(llm_url=imitation.url, api_key="engine-secret")
    assert _ask(session).choices[0].message.content


def test_the_key_goes_in_the_named_header(proxy, imitation):
    imitation.configure(api_key="engine-secret", api_key_header="x-api-key")
    session = proxy.create(llm_url=imitation.url, api_key="engine-secret", auth_header="x-api-key")
    assert _ask(session).choices[0].message.content
    wrong = proxy.create(llm_url=imitation.url, api_key="engine-secret")  # Bearer, where x-api-key is asked
    with pytest.raises(openai.APIStatusError) as caught:
        _ask(wrong)
    assert caught.value.status_code in (401, 502) and "API key" in str(caught.value)


def test_a_bad_header_name_is_refused_at_session_creation(proxy):
    import httpx

    r = httpx.post(f"{proxy.url}/sessions", json={"model": MODEL, "api_key": "k", "auth_header": "x api key"},
                   headers=proxy.admin)  # fmt: skip
    assert r.status_code == 422 and "auth_header" in r.text
