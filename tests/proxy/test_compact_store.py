"""Turns stored as what is new in them read back exactly as the proxy captured them.

The conversation is a real one: the messages mini-swe-agent 2.4.6 sent in a recorded rollout
(tests/harnesses/data), replayed call by call through the proxy with the real `openai` client,
streamed and not, with the engine-only fields asked for and not. A spy on the turn writer keeps what
the proxy handed the store; reading the session back must give the same request and response, byte
for byte as JSON (key order and number spelling included), and the same arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import orjson
import pytest
from sqlalchemy import select

from capture_proxy.store.codec import PackedMask, decode_mask, encode_mask, prefix_mask
from capture_proxy.store.schema import TurnRow

from .conftest import MODEL

TRAJECTORY = Path(__file__).parents[1] / "harnesses" / "data" / "mini-swe-agent-step-limit.traj.json"
SENT_KEYS = ("role", "content", "tool_calls", "tool_call_id")
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def agent_calls() -> list[list[dict]]:
    """The message list of each of the agent's model calls in the recorded rollout."""
    messages = [
        {k: m[k] for k in SENT_KEYS if k in m}
        for m in json.loads(TRAJECTORY.read_text())["messages"]
        if m["role"] != "exit"
    ]
    calls = [messages[:i] for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [*calls, messages]  # and the call after the last tool output


def _dump(turn) -> dict:
    return {
        "request": orjson.dumps(turn.request),
        "response": orjson.dumps(turn.response),
        "arrays": (
            list(turn.prompt_token_ids),
            list(turn.completion_token_ids),
            list(turn.per_token_logps),
            list(turn.loss_mask),
        ),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("engine_fields", [False, True], ids=["agent-fields", "ids-and-logprobs"])
def test_compact_turns_read_back_as_captured(proxy, stream, engine_fields):
    written: list[dict] = []
    writer = proxy.service.writer
    write = writer.write

    async def spy(session_id, seq, turn):
        written.append(_dump(turn))
        await write(session_id, seq, turn)

    writer.write = spy
    session = proxy.create()
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    extra = {"logprobs": True, "extra_body": {"return_token_ids": True}} if engine_fields else {}
    calls = agent_calls()
    for messages in calls:
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, stream=stream, **extra
        )
        if stream:
            list(reply)

    stored = [_dump(t) for t in proxy.store.get_turns(session.session_id)]
    assert len(stored) == len(written) == len(calls)
    assert stored == written

    with proxy.store._engine.connect() as conn:
        rows = conn.execute(
            select(TurnRow.seq, TurnRow.request_shared, TurnRow.response_elided)
            .where(TurnRow.session_id == session.session_id)
            .order_by(TurnRow.seq)
        ).all()
    # Each call after the first resends the history: only its new messages are stored.
    assert [r.request_shared for r in rows] == [0] + [len(m) - 2 for m in calls[1:]]
    # Non-streamed replies with ids and logprobs keep them in the arrays only.
    assert all(bool(r.response_elided) == (engine_fields and not stream) for r in rows)


def test_a_prefix_masks_packed_form_is_what_its_list_packs_to() -> None:
    for n_prompt, n_completion in ((0, 0), (0, 5), (3, 0), (7, 9), (8, 8), (512, 64), (16_384, 63)):
        for trainable in (True, False):
            mask = prefix_mask(n_prompt, n_completion, trainable)
            assert type(mask) is PackedMask
            assert mask == [0] * n_prompt + [int(trainable)] * n_completion
            assert mask.packed == encode_mask(list(mask))
            assert decode_mask(mask.packed, n_prompt + n_completion) == list(mask)
