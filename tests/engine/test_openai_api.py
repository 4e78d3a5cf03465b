"""The engine through the real `openai` client: vLLM's dialect, processed logprobs, batching, errors."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import torch

from tests.engine.conftest import MAX_MODEL_LEN, engine_app, serve

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
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
    {"role": "user", "content": "List the files."},
]
IDS = {"return_token_ids": True}


@pytest.fixture
def client(engine):
    with openai.OpenAI(base_url=engine.v1, api_key="unused", max_retries=0) as c:
        yield c


def recompute(
    reference, prompt_ids: list[int], completion_ids: list[int], temperature: float, top_k: int = -1
):
    """log-softmax of the model's temperature-scaled logits at each sampled token (one separate forward)."""
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    scores = logits[len(prompt_ids) - 1 : -1] / temperature
    if top_k > 0:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    logprobs = torch.log_softmax(scores, dim=-1)
    return [float(logprobs[i, t]) for i, t in enumerate(completion_ids)]


def test_models_lists_the_served_name_with_max_model_len(engine):
    body = httpx.get(f"{engine.v1}/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [("tiny", MAX_MODEL_LEN)]


def test_chat_with_tools_returns_token_ids_logprobs_and_version(client, reference):
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=12, temperature=0.8,
        logprobs=True, top_logprobs=3, extra_body=IDS,
    )  # fmt: skip
    assert raw.headers["x-policy-version"] == "default"
    resp = raw.parse()
    extra = resp.model_extra
    _, tokenizer = reference
    rendered = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert extra["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    choice = resp.choices[0]
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == resp.usage.completion_tokens == len(choice.logprobs.content)
    assert resp.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert choice.finish_reason in ("length", "stop", "tool_calls")
    assert all(len(entry.top_logprobs) == 3 for entry in choice.logprobs.content)
    assert [e.token for e in choice.logprobs.content] == [tokenizer.decode([t]) for t in token_ids]
    assert choice.message.role == "assistant"


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chat_logprobs_equal_a_separate_forward_pass(client, reference, temperature):
    resp = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=24, temperature=temperature, logprobs=True,
        top_logprobs=0, seed=7, extra_body=IDS,
    )  # fmt: skip
    sampled = [e.logprob for e in resp.choices[0].logprobs.content]
    expected = recompute(
        reference, resp.model_extra["prompt_token_ids"], resp.choices[0].model_extra["token_ids"], temperature
    )
    assert sampled == pytest.approx(expected, abs=1e-5)


def test_completion_logprobs_after_top_k_are_processed(client, reference):
    resp = client.completions.create(
        model="tiny",
        prompt="def add(a, b):",
        max_tokens=16,
        temperature=0.7,
        logprobs=2,
        extra_body={**IDS, "top_k": 5},
    )
    choice = resp.choices[0]
    expected = recompute(
        reference, choice.model_extra["prompt_token_ids"], choice.model_extra["token_ids"], 0.7, top_k=5
    )
    assert choice.logprobs.token_logprobs == pytest.approx(expected, abs=1e-5)
    assert all(len(top) in (2, 3) for top in choice.logprobs.top_logprobs)


def test_completion_accepts_token_ids_and_seed_reproduces(client):
    def run():
        return client.completions.create(
            model="tiny", prompt=[5, 6, 7, 8], max_tokens=10, seed=11, extra_body=IDS
        )

    a, b = run(), run()
    assert a.choices[0].model_extra["prompt_token_ids"] == [5, 6, 7, 8]
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 10


def test_stop_string_cuts_the_text(client):
    body = {
        "model": "tiny",
        "prompt": "hello world",
        "max_tokens": 20,
        "seed": 3,
        "extra_body": {"ignore_eos": True},
    }
    full = client.completions.create(**body).choices[0].text
    stop = full[8:11]
    assert stop.strip(), "need a visible stop string"
    cut = client.completions.create(stop=[stop], **body).choices[0]
    assert cut.finish_reason == "stop" and cut.model_extra["stop_reason"] == stop
    assert cut.text == full[: full.find(stop)]


def test_chat_stream_matches_the_non_streamed_call(client):
    body = dict(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=10, seed=5, logprobs=True, top_logprobs=0
    )
    whole = client.chat.completions.create(**body, extra_body=IDS)
    with client.chat.completions.with_streaming_response.create(
        **body, stream=True, stream_options={"include_usage": True}, extra_body=IDS
    ) as raw:
        assert raw.headers["x-policy-version"] == "default"
        chunks = list(raw.parse())
    assert chunks[0].model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
    assert chunks[0].choices[0].delta.role == "assistant"
    steps = [c for c in chunks if c.choices and c.choices[0].model_extra.get("token_ids")]
    ids = [t for c in steps for t in c.choices[0].model_extra["token_ids"]]
    assert ids == whole.choices[0].model_extra["token_ids"]
    logprobs = [e.logprob for c in steps for e in c.choices[0].logprobs.content]
    assert logprobs == pytest.approx([e.logprob for e in whole.choices[0].logprobs.content], abs=1e-5)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert steps[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_completion_stream_carries_prompt_ids_first_and_token_deltas(client):
    stream = client.completions.create(
        model="tiny", prompt="import os", max_tokens=6, stream=True, seed=2, extra_body=IDS
    )
    chunks = list(stream)
    assert chunks[0].choices[0].model_extra["prompt_token_ids"]
    assert all("prompt_token_ids" not in c.choices[0].model_extra for c in chunks[1:])
    assert sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks) == 6
    assert chunks[-1].choices[0].finish_reason == "length"


def test_tokens_as_token_ids(tiny_dir):
    app = engine_app(tiny_dir, return_tokens_as_token_ids=True)
    with serve(app) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as c:
        chat = c.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=1, extra_body=IDS
        )
        ids = chat.choices[0].model_extra["token_ids"]
        assert [e.token for e in chat.choices[0].logprobs.content] == [f"token_id:{t}" for t in ids]
        assert all(e.top_logprobs[0].token.startswith("token_id:") for e in chat.choices[0].logprobs.content)
        comp = c.completions.create(model="tiny", prompt="x", max_tokens=3, logprobs=0, extra_body=IDS)
        assert comp.choices[0].logprobs.tokens == [
            f"token_id:{t}" for t in comp.choices[0].model_extra["token_ids"]
        ]


async def test_concurrent_requests_are_batched(engine):
    before = engine.scheduler.stats["steps"]
    async with openai.AsyncOpenAI(base_url=engine.v1, api_key="x", max_retries=0) as c:
        results = await asyncio.gather(
            *(
                c.completions.create(
                    model="tiny", prompt=f"task {i}", max_tokens=24, extra_body={"ignore_eos": True}
                )
                for i in range(8)
            )
        )
    assert all(r.usage.completion_tokens == 24 for r in results)
    assert engine.scheduler.stats["max_batch"] >= 4
    # Batched: far fewer decode steps than the 8 * 23 a serial engine would need.
    assert engine.scheduler.stats["steps"] - before < 8 * 23


def _error(exc: openai.APIStatusError) -> dict:
    return exc.response.json()["error"]


@pytest.mark.parametrize(
    "overrides, status, param, words",
    [
        ({"model": "no-such-model"}, 404, "model", "does not exist"),
        ({"max_tokens": -1}, 400, "max_tokens", "at least 1"),
        ({"max_tokens": MAX_MODEL_LEN}, 400, "max_tokens", "maximum context length"),
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            400,
            "tools",
            "function.name",
        ),
        ({"temperature": -0.5}, 400, "temperature", "non-negative"),
        ({"tool_choice": "required", "tools": TOOLS}, 400, "tool_choice", "not supported"),
    ],
)
def test_bad_chat_requests_get_vllm_errors(client, overrides, status, param, words):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **overrides}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**body)
    assert info.value.status_code == status
    error = _error(info.value)
    assert error["code"] == status and error["param"] == param and words in error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_prompt_longer_than_max_model_len_is_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=[7] * (MAX_MODEL_LEN + 5), max_tokens=1)
    assert "maximum context length is 1024" in _error(info.value)["message"]


def test_malformed_body_is_400_naming_the_field(engine):
    r = httpx.post(f"{engine.v1}/chat/completions", json={"model": "tiny", "messages": "hi"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "BadRequestError" and "messages" in r.json()["error"]["message"]
    assert r.headers["x-policy-version"] == "default"


def test_a_client_that_hangs_up_stops_its_generation(engine):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 900, "stream": True, "ignore_eos": True}
    before = engine.scheduler.stats["tokens"]
    with httpx.stream("POST", f"{engine.v1}/completions", json=body) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    deadline = time.monotonic() + 30
    while engine.scheduler.num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.scheduler.num_running == 0
    assert engine.scheduler.stats["tokens"] - before < 900
