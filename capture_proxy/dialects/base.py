"""What a dialect is: a request translation onto chat completions, a reply and stream translation back,
and errors in the agent's own shape. Plus the few helpers both dialects share."""

from __future__ import annotations

import json
from typing import Any, Protocol

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response

from capture_proxy.errors import ProxyRequestError


class DialectStream(Protocol):
    """One streamed reply: chat-completion chunks in, the agent's SSE events out (as bytes)."""

    def start(self) -> bytes:
        """The events that open the stream, before the engine's first chunk is translated."""
        ...

    def feed(self, chunk: dict) -> bytes:
        """The events for one chat-completion chunk (possibly none)."""
        ...

    def finish(self) -> bytes:
        """The closing events, sent once the turn is stored (the chat stream's `[DONE]`)."""
        ...

    def fail(self, status: int, message: str) -> bytes:
        """The error event that ends a stream the engine or the store failed mid-way."""
        ...


class Dialect(Protocol):
    name: str
    """Recorded as the turn's `metadata.dialect`."""

    def authorization(self, headers: Headers) -> str | None:
        """The `Bearer <session key>` the chat path authenticates, from wherever this API puts the key."""
        ...

    def parse(self, body: Any) -> Any:
        """The request this body holds, every field the dialect reads typed (`shapes`); ProxyRequestError
        (400, naming the field) if it does not fit."""
        ...

    def to_chat(self, request: Any) -> dict:
        """The chat-completions request for a parsed request."""
        ...

    def from_chat(self, reply: dict, request: Any) -> dict:
        """The agent's reply for a non-streamed chat completion."""
        ...

    def stream(self, request: Any) -> DialectStream:
        """A translator for one streamed reply to `request`."""
        ...

    def error(self, status: int, message: str, code: str | None, param: str | None = None) -> Response:
        """An error reply in this API's shape."""
        ...


def invalid(message: str, param: str | None = None) -> ProxyRequestError:
    """A 400 for a malformed request, naming the field."""
    return ProxyRequestError(400, message, param=param, code="invalid_request")


def unsupported(what: str, param: str) -> ProxyRequestError:
    """A 400 for a feature the engine cannot serve, saying so rather than silently dropping it."""
    return ProxyRequestError(
        400, f"{param}: {what} is not supported by the capture proxy", param=param, code="unsupported"
    )


def sse(event: str, data: dict) -> bytes:
    """One named server-sent event, as both APIs send them (`event:` line, then one `data:` line)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def bearer_from(headers: Headers) -> str | None:
    """`Authorization` as sent, or a bare `x-api-key` (Anthropic's header) as `Bearer <key>`."""
    auth = headers.get("authorization")
    if auth:
        return auth
    key = headers.get("x-api-key")
    return f"Bearer {key}" if key else None


def arguments_text(value: Any) -> str:
    """Tool-call arguments as the JSON text a chat message carries. Spacing follows `json.dumps`'s
    defaults (`", "`, `": "`), the way hermes-style models write them, so the replayed call renders as
    the engine wrote it when the agent sends it back as an object (Anthropic's `input`)."""
    return json.dumps(value, ensure_ascii=False)


def arguments_object(text: str | None) -> dict:
    """The arguments text of a chat tool call as an object; text that is not a JSON object is kept whole
    under `_raw`, so an agent never gets a call it cannot read and nothing the model wrote is lost."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def stream_fields(stream: bool | None) -> dict:
    """The chat fields of a streamed call, with the usage chunk: both APIs report token counts in their
    closing event."""
    return {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
