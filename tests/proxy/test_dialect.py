"""The vLLM dialect on recorded wire samples (tests/fixtures/vllm/, produced by the vLLM imitation in
`engine.imitation`, whose shapes follow vLLM's chat_completion/protocol.py and serving code)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from capture_proxy.streaming import SSEDecoder, StreamAssembler
from capture_proxy.upstream import (
    Wants,
    capture_chat,
    capture_completion,
    check_tokens,
    rewrite_request,
    strip_for_agent,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def load(name: str) -> dict:
    return orjson.loads((FIXTURES / name).read_bytes())


def assemble(
    name: str, endpoint: str, piece: int, wants: Wants | None = None
) -> tuple[StreamAssembler, bytes]:
    raw = (FIXTURES / name).read_bytes()
    decoder, asm, out = SSEDecoder(), StreamAssembler(endpoint, wants or Wants()), []
    for i in range(0, len(raw), piece):
        out.append(asm.relay(decoder.feed(raw[i : i + piece])))
        if asm.done:
            break
    return asm, b"".join(out)


def test_chat_capture_reads_ids_and_logprobs():
    resp = load("chat_completion.json")
    cap = capture_chat(resp)
    choice = resp["choices"][0]
    assert cap.status == "ok"
    assert cap.prompt_ids == resp["prompt_token_ids"]
    assert cap.completion_ids == choice["token_ids"]
    assert cap.logps == [c["logprob"] for c in choice["logprobs"]["content"]]
    strip_for_agent(resp, Wants())
    assert "prompt_token_ids" not in resp and "token_ids" not in resp["choices"][0]
    assert resp["choices"][0]["logprobs"] is None


def test_completion_capture_reads_per_choice_prompt_ids():
    resp = load("completion.json")
    cap = capture_completion(resp)
    assert cap.status == "ok"
    assert cap.prompt_ids == resp["choices"][0]["prompt_token_ids"]
    assert cap.logps == resp["choices"][0]["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("piece", [1, 7, 64, 1 << 20])
def test_stream_assembly_is_independent_of_how_bytes_arrive(piece):
    asm, relayed = assemble("chat_completion_stream.sse", "chat", piece)
    assert asm.done and asm.capture().status == "ok"
    whole = load("chat_completion.json")
    assert asm.capture().prompt_ids == whole["prompt_token_ids"]
    assert asm.capture().completion_ids == whole["choices"][0]["token_ids"]
    assert asm.response()["choices"][0]["message"]["content"] == whole["choices"][0]["message"]["content"]
    assert asm.usage["completion_tokens"] == len(whole["choices"][0]["token_ids"])
    # What the agent gets: every chunk, without the engine-only fields.
    assert b"token_ids" not in relayed and b"token_id:" not in relayed
    assert (
        relayed.count(b"data: ")
        == (FIXTURES / "chat_completion_stream.sse").read_bytes().count(b"data: ") - 1
    )


def test_stream_tool_call_assembly():
    asm, _ = assemble(
        "chat_completion_stream_tool_call.sse", "chat", 4096, Wants(logprobs=True, token_ids=True)
    )
    whole = load("chat_completion_tool_call.json")
    message = asm.response()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == whole["choices"][0]["message"]["tool_calls"][0]["function"]
    assert asm.finish_reason == "tool_calls"
    assert asm.capture().completion_ids == whole["choices"][0]["token_ids"]


def test_completion_stream_assembly():
    asm, _ = assemble("completion_stream.sse", "completions", 100)
    whole = load("completion.json")
    assert asm.capture().prompt_ids == whole["choices"][0]["prompt_token_ids"]
    assert asm.capture().logps == whole["choices"][0]["logprobs"]["token_logprobs"]
    assert asm.response()["choices"][0]["text"] == whole["choices"][0]["text"]


@pytest.mark.parametrize(
    ("prompt", "ids", "tokens", "logps", "status"),
    [
        ([1], [5, 6], ["token_id:5", "token_id:6"], [-0.1, -0.2], "ok"),
        ([1], [5, 6], ["a", "b"], [-0.1, -0.2], "ok"),  # engine without --return-tokens-as-token-ids
        (None, [5], ["token_id:5"], [-0.1], "missing_token_ids"),
        ([1], None, ["token_id:5"], [-0.1], "missing_token_ids"),
        ([1], [5], None, None, "missing_logprobs"),
        ([1], [5, 6], ["token_id:5"], [-0.1], "token_mismatch"),
        ([1], [5, 6], ["token_id:5", "token_id:7"], [-0.1, -0.2], "token_mismatch"),
    ],
)
def test_check_tokens(prompt, ids, tokens, logps, status):
    assert check_tokens(prompt, ids, tokens, logps)[0] == status


def test_rewrite_train_enforces_session_sampling():
    body = {
        "model": "m",
        "messages": [],
        "temperature": 0.1,
        "top_p": 0.2,
        "logit_bias": {"1": 5},
        "max_tokens": 900,
    }
    up, sent, wants = rewrite_request(
        body,
        endpoint="chat",
        model="policy",
        purpose="train",
        sampling={"temperature": 0.8, "max_tokens": 500},
    )
    assert up["model"] == "policy" and "logit_bias" not in up
    assert (up["temperature"], up["top_p"], up["top_k"], up["min_p"], up["max_tokens"]) == (
        0.8,
        1.0,
        -1,
        0.0,
        500,
    )
    assert (up["logprobs"], up["top_logprobs"], up["return_token_ids"]) == (True, 0, True)
    assert sent["temperature"] == 0.8 and not wants.logprobs and not wants.token_ids
    assert body["temperature"] == 0.1  # the agent's request is recorded as it was sent


def test_rewrite_eval_passes_agent_sampling():
    body = {"model": "m", "prompt": "x", "temperature": 0.1, "top_p": 0.2, "logprobs": 2}
    up, sent, wants = rewrite_request(body, endpoint="completions", model="m", purpose="eval", sampling={})
    assert (up["temperature"], up["top_p"], up["logprobs"]) == (0.1, 0.2, 2)
    assert "top_k" not in up and wants.logprobs
