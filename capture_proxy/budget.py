"""The reply once a session's model-call budget is spent: a normal completion, streamed or not as the
agent asked, that tells the agent to stop; the proxy writes it alone, without the engine."""

from __future__ import annotations

import time
import uuid

import orjson
from starlette.responses import Response

from capture_proxy.responses import SSE_HEADERS, json_response
from capture_proxy.upstream import Endpoint

BUDGET_MESSAGE = (
    "The model-call budget of this session ({n} calls) is exhausted; no further model calls will be "
    "answered. Stop now and submit your work as it is."
)


def budget_response(endpoint: Endpoint, n: int, body: dict) -> Response:
    """The terminal reply once the step budget is spent: a normal completion that tells the agent to stop."""
    text = BUDGET_MESSAGE.format(n=n)
    created = int(time.time())
    model = body.get("model", "")
    if endpoint == "chat":
        rid = f"chatcmpl-budget-{uuid.uuid4().hex}"
        if body.get("stream"):
            role = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            last = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": "stop"}
            return _sse_response(rid, "chat.completion.chunk", created, model, [[role], [last]])
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "stop",
        }
        obj = "chat.completion"
    else:
        rid = f"cmpl-budget-{uuid.uuid4().hex}"
        if body.get("stream"):
            last = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return _sse_response(rid, "text_completion", created, model, [[last]])
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
        obj = "text_completion"
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return json_response(
        {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage}
    )


def _sse_response(rid: str, obj: str, created: int, model: str, choices: list[list[dict]]) -> Response:
    events = [
        b"data: "
        + orjson.dumps({"id": rid, "object": obj, "created": created, "model": model, "choices": c})
        + b"\n\n"
        for c in choices
    ]
    return Response(
        b"".join(events) + b"data: [DONE]\n\n", media_type="text/event-stream", headers=SSE_HEADERS
    )
