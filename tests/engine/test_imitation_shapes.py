"""The vLLM imitation's wire shapes where they follow vLLM's serving code (top-logprob bytes, the None
fields its chunks keep) and its benchmark tokenizer (`bytes_per_token`): prompts still extend the
previous prompt + completion, and a tool call streams back whole."""

from __future__ import annotations

import orjson
from starlette.testclient import TestClient

from engine.imitation import ImitationSettings, chat_prompt_ids, create_imitation_app

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
ARGS = '{"command": "cd /repo && python -m pytest -q tests/test_parser.py"}'


def _client(**settings) -> TestClient:
    return TestClient(create_imitation_app(ImitationSettings(**settings)))


def _events(raw: bytes) -> list[dict]:
    lines = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(line) for line in lines if line != b"[DONE]"]


def test_hashed_tokens_keep_prompts_extending_the_last_prompt_and_completion() -> None:
    client = _client(bytes_per_token=4, tool_arguments=ARGS)
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix the parser."},
    ]
    previous: list[int] = []
    for _ in range(3):
        body = {"model": "imitation-model", "messages": messages, "tools": TOOLS, "logprobs": True,
                "top_logprobs": 0, "return_token_ids": True}  # fmt: skip
        reply = client.post("/v1/chat/completions", json=body).json()
        prompt, choice = reply["prompt_token_ids"], reply["choices"][0]
        assert prompt == chat_prompt_ids(messages, TOOLS, 4)
        assert prompt[: len(previous)] == previous  # the last prompt + completion, token for token
        assert max(prompt) > 1000  # ids of a large vocabulary, not bytes
        (call,) = choice["message"]["tool_calls"]
        assert call["function"] == {"name": "bash", "arguments": ARGS}
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        previous = prompt + choice["token_ids"]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "1 failed, 4 passed"},
        ]
    assert (
        len(choice["token_ids"])
        == -(-len(f'<tool_call>{{"name": "bash", "arguments": {ARGS}}}</tool_call>') // 4) + 1
    )


def test_a_hashed_tool_call_streams_back_whole_with_every_tokens_ids_and_logprobs() -> None:
    client = _client(bytes_per_token=4, tool_arguments=ARGS)
    body = {"model": "imitation-model", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS,
            "stream": True, "logprobs": True, "top_logprobs": 0, "return_token_ids": True}  # fmt: skip
    events = _events(client.post("/v1/chat/completions", json=body).content)
    calls = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls", ())]
    assert calls[0]["function"]["name"] == "bash" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert "".join(tc["function"].get("arguments", "") for tc in calls) == ARGS
    tokens = [e["choices"][0] for e in events[1:]]
    assert all(len(c["token_ids"]) == 1 and len(c["logprobs"]["content"]) == 1 for c in tokens)
    assert tokens[-1]["finish_reason"] == "tool_calls"


def test_chunks_keep_the_none_fields_vllm_sets() -> None:
    client = _client()
    body = {"model": "imitation-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    first, *rest = _events(client.post("/v1/chat/completions", json=body).content)
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None
    assert all("token_ids" in e["choices"][0] and e["choices"][0]["token_ids"] is None for e in rest)


def test_top_logprob_bytes_are_those_of_the_token_string_shown() -> None:
    client = _client()
    body = {"model": "imitation-model", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
            "top_logprobs": 3}  # fmt: skip
    entry = client.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"][0]
    assert entry["token"].startswith("token_id:") and bytes(entry["bytes"]).decode() != entry["token"]
    assert len(entry["top_logprobs"]) == 3
    assert all(bytes(alt["bytes"]).decode() == alt["token"] for alt in entry["top_logprobs"])
