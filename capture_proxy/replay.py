"""Streamed agent calls under `stream_mode = "replay"`: the engine's whole (unstreamed) reply, already
captured and stored, written back as the event stream the agent asked for.

One event carries each choice whole (its delta holds the full message, tool calls with their indices),
then a usage event when the agent asked for one (`stream_options.include_usage`), then `[DONE]`. That
is a valid OpenAI stream: clients accumulate deltas, so one big delta reads as many small ones. OpenEnv's
capture proxy answers streams the same way (openenv 0.10.0, `openenv/core/harness/capture/sse.py`,
`response_to_chunk`).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from capture_proxy.calls import ModelCall
from capture_proxy.responses import SSE_HEADERS

_CHOICE_EXTRAS = ("token_ids", "prompt_token_ids", "stop_reason")
"""Engine fields of a choice that go into its event when the reply still carries them (the agent
asked for them; `strip_for_agent` removed the rest)."""


def replayed(call: ModelCall, reply: dict) -> Response:
    """`reply` (a chat or text completion, stripped for the agent) as an event stream."""
    chat = call.endpoint == "chat"
    head = {
        "id": reply.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": reply.get("created"),
        "model": reply.get("model"),
    }
    first: dict[str, Any] = dict(head)
    if "prompt_token_ids" in reply:  # vLLM's streamed chat puts it on the first event, as unstreamed
        first["prompt_token_ids"] = reply["prompt_token_ids"]
    choices = reply.get("choices") or []
    first["choices"] = [_chat_choice(c) if chat else _text_choice(c) for c in choices]
    events = [first]
    options = call.request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        events.append({**head, "choices": [], "usage": reply.get("usage")})
    body = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)
    return Response(body + b"data: [DONE]\n\n", media_type="text/event-stream", headers=SSE_HEADERS)


def _chat_choice(choice: dict) -> dict:
    message = choice.get("message") or {}
    # vLLM's streams open with `"content": ""`, so an agent reads "" rather than null from them.
    delta: dict[str, Any] = {
        "role": message.get("role") or "assistant",
        "content": message.get("content") or "",
    }
    for key in ("reasoning", "reasoning_content"):
        if message.get(key) is not None:
            delta[key] = message[key]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    event = {
        "index": choice.get("index", 0),
        "delta": delta,
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
    }
    event.update((key, choice[key]) for key in _CHOICE_EXTRAS if key in choice)
    return event


def _text_choice(choice: dict) -> dict:
    event = {
        "index": choice.get("index", 0),
        "text": choice.get("text") or "",
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice.get("finish_reason"),
    }
    event.update((key, choice[key]) for key in _CHOICE_EXTRAS if key in choice)
    return event
