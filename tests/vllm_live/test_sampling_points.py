"""Sampling fields, the live vLLM and engine/imitation.py (what the fast proxy tests run against) side by
side, as test_imitation_points.py compares their plain replies: `n` > 1, `stop` strings and
`stop_token_ids` (finish_reason and stop_reason), top logprobs with token-id strings, completion
logprobs, `max_tokens` length stops, and the 400s for bad values, byte for byte. The two models differ
(random weights, a byte-level stand-in), so a stop is one each model really writes: a piece of its own
unstopped completion with the same seed.

The capture proxy records one completion per call and refuses `n` != 1 (capture_proxy/upstream.py); a
stop string's turn is stored with the ids vLLM kept (the token that completed the string included)."""

from __future__ import annotations

import json

import httpx
import pytest

from capture_proxy.app import create_app as create_proxy_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from engine.in_process import serve_in_thread
from engine.server import EngineConfig, create_app

pytestmark = pytest.mark.timeout(900)  # the module's first test may wait for vLLM's start
USER = [{"role": "user", "content": "hi"}]
ADMIN = "vllm-live-sampling-admin-key"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def embedded(tiny_path):
    config = EngineConfig(model=str(tiny_path), served_model_name="tiny", max_model_len=1024, num_threads=1)
    with serve_in_thread(create_app(config), start_timeout_s=60, log_level="warning") as url:
        yield url


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(
        url + path, json={"model": "tiny", "seed": 3, "return_token_ids": True, **body}, timeout=120
    )


def _both(vllm, imitation, path: str, body: dict) -> list[dict]:
    replies = [_post(url, path, body) for url in (vllm.url, imitation)]
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    return [r.json() for r in replies]


def _text(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _events(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_n_choices(vllm, imitation, path):
    body = {"max_tokens": 3, "n": 3, "logprobs": True if path == CHAT else 0}
    body |= {"messages": USER} if path == CHAT else {"prompt": "def f("}
    for reply in _both(vllm, imitation, path, body):
        choices = reply["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2]
        assert len({tuple(c["token_ids"]) for c in choices}) > 1  # each choice sampled on its own
        assert all(len(c["token_ids"]) == 3 and c["finish_reason"] == "length" for c in choices)
        assert reply["usage"]["completion_tokens"] == 9
    # Streamed: the role chunk of every choice (chat), then each token chunk names its choice's index.
    for url in (vllm.url, imitation):
        events = _events(_post(url, path, body | {"stream": True}))
        ids: dict[int, list[int]] = {}
        for event in events:
            for choice in event["choices"]:
                ids.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
        assert sorted(ids) == [0, 1, 2] and all(len(v) == 3 for v in ids.values())
        if path == CHAT:
            assert [e["choices"][0]["delta"] for e in events[:3]] == [
                {"role": "assistant", "content": ""}
            ] * 3


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_stop_string_and_stop_token_id(vllm, imitation, path, stream):
    """vLLM: a stop string cuts the text before it and keeps the token that completed it; a stop token id
    is kept in token_ids and left out of the text; both finish "stop" and name what stopped them."""
    base = {"max_tokens": 10} | ({"messages": USER} if path == CHAT else {"prompt": "def f("})
    for url in (vllm.url, imitation):
        free = _post(url, path, base).json()["choices"][0]
        text, ids = _text(free), free["token_ids"]
        stop = text[4:6]
        assert len(stop) == 2 and text.index(stop) >= 1, text
        cases = [({"stop": [stop]}, stop), ({"stop_token_ids": [ids[3]]}, ids[3])]
        for extra, reason in cases:
            reply = _post(url, path, base | extra | {"stream": stream})
            if stream:
                events = _events(reply)
                chunks = [c for e in events for c in e["choices"]]
                got_ids = [t for c in chunks for t in c.get("token_ids") or []]
                got_text = "".join(
                    c["delta"].get("content") or "" if path == CHAT else c["text"] for c in chunks
                )
                last = chunks[-1]
            else:
                last = reply.json()["choices"][0]
                got_ids, got_text = last["token_ids"], _text(last)
            assert (last["finish_reason"], last["stop_reason"]) == ("stop", reason), url
            if isinstance(reason, str):
                assert got_text == text[: text.index(stop)], url
                assert ids[: len(got_ids)] == got_ids and 1 <= len(got_ids) <= 6, url
            else:
                assert got_ids == ids[: ids.index(reason) + 1], url
                assert text.startswith(got_text) and len(got_text) < len(text), url


def test_top_logprobs_as_token_id_strings(vllm, imitation):
    chat = {"messages": USER, "max_tokens": 2, "logprobs": True, "top_logprobs": 4}
    completion = {"prompt": "def f(", "max_tokens": 2, "logprobs": 4}
    for reply in _both(vllm, imitation, CHAT, chat):
        for entry, tid in zip(
            reply["choices"][0]["logprobs"]["content"], reply["choices"][0]["token_ids"], strict=True
        ):
            alternatives = entry["top_logprobs"]
            assert alternatives[0] == {"token": f"token_id:{tid}", "logprob": entry["logprob"],
                                       "bytes": list(f"token_id:{tid}".encode())}  # fmt: skip
            assert len(alternatives) == 4 and all(a["token"].startswith("token_id:") for a in alternatives)
    for reply in _both(vllm, imitation, COMPLETIONS, completion):
        choice = reply["choices"][0]
        logprobs = choice["logprobs"]
        tokens = [f"token_id:{t}" for t in choice["token_ids"]]
        assert logprobs["tokens"] == tokens
        # vLLM advances text_offset by the token string it shows (`token_id:N`), not the decoded text.
        assert logprobs["text_offset"] == [0, len(tokens[0])]
        for top, token, logprob in zip(
            logprobs["top_logprobs"], tokens, logprobs["token_logprobs"], strict=True
        ):
            assert next(iter(top.items())) == (token, logprob)  # the sampled token first
            assert len(top) in (4, 5) and all(key.startswith("token_id:") for key in top)  # + the 4 best
    for url in (vllm.url, imitation):  # streamed, the offsets run on across the chunks
        first, second = (
            e["choices"][0]["logprobs"]
            for e in _events(_post(url, COMPLETIONS, completion | {"stream": True}))
        )
        assert (first["text_offset"], second["text_offset"]) == ([0], [len(first["tokens"][0])])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": USER, "n": 0}),
        (CHAT, {"messages": USER, "max_tokens": 0}),
        (CHAT, {"messages": USER, "top_p": 1.5}),
        (CHAT, {"messages": USER, "temperature": 2.5}),
        (CHAT, {"messages": USER, "max_tokens": "many"}),
        (COMPLETIONS, {"prompt": "x", "n": "two"}),
    ],
    ids=["n-0", "max-tokens-0", "top-p-1.5", "temperature-2.5", "max-tokens-string", "completion-n-string"],
)
def test_bad_values_are_refused_alike(vllm, imitation, embedded, path, body):
    real, imit, emb = (_post(url, path, body) for url in (vllm.url, imitation, embedded))
    assert real.status_code == imit.status_code == emb.status_code == 400
    assert real.json() == imit.json()
    if not any(
        isinstance(v, str) for v in body.values()
    ):  # a type error is worded by each server's own handler
        assert emb.json() == real.json()


def test_a_stop_string_turn_is_stored_as_vllm_kept_it(vllm, tmp_path):
    """Through the capture proxy (an eval session keeps the agent's stop and seed): the stored ids are
    vLLM's token_ids, the stop-completing token included; `n` = 2 is refused before vLLM is called."""
    store = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    with serve_in_thread(create_proxy_app(ProxyConfig(admin_key=ADMIN), store), log_level="warning") as proxy:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        spec = {"llm_url": vllm.url, "model": "tiny", "purpose": "eval"}
        session = httpx.post(f"{proxy}/sessions", json=spec, headers=admin).json()
        agent = {"Authorization": f"Bearer {session['api_key']}"}
        free = _post(vllm.url, CHAT, {"messages": USER, "max_tokens": 10}).json()["choices"][0]
        stop = _text(free)[4:6]
        body = {"model": "tiny", "messages": USER, "max_tokens": 10, "seed": 3, "stop": [stop]}
        reply = httpx.post(f"{session['base_url']}/chat/completions", json=body, headers=agent, timeout=120)
        assert reply.status_code == 200, reply.text
        assert (reply.json()["choices"][0]["finish_reason"], reply.json()["choices"][0]["stop_reason"]) == (
            "stop",
            stop,
        )
        refused = httpx.post(f"{session['base_url']}/chat/completions", json=body | {"n": 2}, headers=agent)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
        trace = httpx.get(f"{proxy}/sessions/{session['session_id']}/trace", headers=admin).json()
    store.close()
    (turn,) = trace["turns"]
    direct = _post(vllm.url, CHAT, {"messages": USER, "max_tokens": 10, "stop": [stop]}).json()["choices"][0]
    assert turn["completion_token_ids"] == direct["token_ids"] and turn["metadata"]["finish_reason"] == "stop"
