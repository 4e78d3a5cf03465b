"""engine/imitation.py (the fast stand-in the proxy tests use) and the embedded engine, checked point by
point against the live vLLM: the shapes the capture proxy reads must be vLLM's own.

Known differences, left as they are because the proxy never depends on them: vLLM 0.32 adds top-level
`ec_transfer_params` and `metrics` to every reply (and `routed_experts` to a completion's choice,
`system_fingerprint` to the usage chunk). `n`, stops, top logprobs and the 400s for bad sampling values are
compared in test_sampling_points.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from engine.in_process import serve_in_thread
from engine.server import EngineConfig, create_app

pytestmark = pytest.mark.timeout(900)  # the module's first test waits for vLLM's start
VLLM_ONLY_TOP = {"ec_transfer_params", "metrics"}
"""Top-level reply fields vLLM 0.32 sends that the imitation does not (no client reads them)."""
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def embedded(tiny_path):
    config = EngineConfig(
        model=str(tiny_path), served_model_name="tiny", max_model_len=1024, num_threads=1,
        return_tokens_as_token_ids=True,  # as the vLLM backend serves them
    )  # fmt: skip
    with serve_in_thread(create_app(config), start_timeout_s=60, log_level="warning") as url:
        yield url


def _both(vllm, imitation, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    return (
        httpx.post(vllm.url + path, json={"model": "tiny", **body}, timeout=120),
        httpx.post(imitation + path, json={"model": "tiny", **body}, timeout=30),
    )


def test_chat_reply_fields(vllm, imitation):
    body = {"messages": USER, "max_tokens": 3, "logprobs": True, "top_logprobs": 3, "return_token_ids": True}
    real, imit = (r.json() for r in _both(vllm, imitation, "/v1/chat/completions", body))
    assert set(real) - set(imit) == VLLM_ONLY_TOP and set(imit) <= set(real)
    assert set(real["choices"][0]) == set(imit["choices"][0])
    assert set(real["choices"][0]["message"]) == set(imit["choices"][0]["message"])
    for reply in (real, imit):
        choice = reply["choices"][0]
        assert (
            reply["prompt_token_ids"]
            and len(choice["token_ids"]) == 3
            and choice["finish_reason"] == "length"
        )
        for entry, tid in zip(choice["logprobs"]["content"], choice["token_ids"], strict=True):
            assert entry["token"] == f"token_id:{tid}" and len(entry["top_logprobs"]) == 3
            assert entry["top_logprobs"][0]["token"] == entry["token"]  # the sampled token comes first
            assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}


def test_completion_reply_fields(vllm, imitation):
    body = {"prompt": "def f(", "max_tokens": 3, "logprobs": 0, "return_token_ids": True}
    real, imit = (r.json() for r in _both(vllm, imitation, "/v1/completions", body))
    assert set(real) - set(imit) == VLLM_ONLY_TOP
    assert set(real["choices"][0]) - set(imit["choices"][0]) == {"routed_experts"}
    for reply in (real, imit):
        choice = reply["choices"][0]
        assert choice["prompt_token_ids"] and len(choice["token_ids"]) == 3
        assert [f"token_id:{t}" for t in choice["token_ids"]] == choice["logprobs"]["tokens"]
        assert len(choice["logprobs"]["token_logprobs"]) == 3


def _skeleton(response: httpx.Response) -> list:
    """Each event's keys and its choices' keys: the structure a streaming client walks."""
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    shapes = []
    for event in map(json.loads, events[:-1]):
        shapes.append((sorted(set(event) - {"system_fingerprint"}), [sorted(c) for c in event["choices"]]))
    return shapes


def test_stream_event_structure(vllm, imitation):
    body = {
        "messages": USER, "max_tokens": 3, "logprobs": True, "return_token_ids": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    real, imit = _both(vllm, imitation, "/v1/chat/completions", body)
    assert _skeleton(real) == _skeleton(imit)
    first = json.loads(real.text.splitlines()[0][6:])
    assert first["prompt_token_ids"] and first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_unknown_model_and_model_list(vllm, imitation):
    real, imit = _both(vllm, imitation, "/v1/chat/completions", {"model": "nope", "messages": USER})
    assert real.status_code == imit.status_code == 404
    assert real.json() == imit.json()  # message, type, param and code alike
    models = [httpx.get(url + "/v1/models").json()["data"][0] for url in (vllm.url, imitation)]
    assert set(models[0]) == set(models[1]) and models[0]["max_model_len"] > 0


@pytest.mark.parametrize("temperature", [0.001, 0.5])
def test_the_embedded_engine_reports_vllms_logprobs(vllm, embedded, temperature):
    """Same weights, same prompt: the first token's top alternatives agree, also below vLLM's 0.01
    temperature floor, which the embedded engine applies too (engine.protocol.effective_temperature)."""
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
        "temperature": temperature, "logprobs": True, "top_logprobs": 5, "return_token_ids": True, "seed": 0,
    }  # fmt: skip
    real = httpx.post(vllm.v1 + "/chat/completions", json=body, timeout=120).json()
    emb = httpx.post(embedded + "/v1/chat/completions", json=body, timeout=120).json()
    assert real["prompt_token_ids"] == emb["prompt_token_ids"]

    def alternatives(reply: dict) -> dict[str, float]:
        # Both list the sampled token first (vLLM whatever its rank), so compare the tokens both list.
        entry = reply["choices"][0]["logprobs"]["content"][0]
        return {alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]}

    real_alts, emb_alts = alternatives(real), alternatives(emb)
    shared = real_alts.keys() & emb_alts.keys()
    assert len(shared) >= 3, (real_alts, emb_alts)
    for token in shared:  # / 0.01 amplifies float32 rounding by 100
        assert emb_alts[token] == pytest.approx(real_alts[token], abs=2e-3 if temperature < 0.01 else 1e-4)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": USER, "temperature": -1}),
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 50}),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}),
    ],
    ids=["negative-temperature", "top-logprobs-50", "completion-logprobs-21"],
)
def test_sampling_refusals(vllm, imitation, path, body):
    real, imit = _both(vllm, imitation, path, body)
    assert real.status_code == imit.status_code == 400
    assert real.json() == imit.json()
