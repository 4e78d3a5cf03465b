"""What a dialect is: a request translation onto chat completions, a reply and stream translation back,
and errors in the agent's own shape. Plus the few helpers both dialects share."""

from __future__ import annotations

import json
from collections.abc import Callable
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

    def to_chat(self, body: Any) -> dict:
        """The chat-completions request for this body; ProxyRequestError (400, naming the field) if malformed."""
        ...

    def from_chat(self, reply: dict, request: dict) -> dict:
        """The agent's reply for a non-streamed chat completion."""
        ...

    def stream(self, request: dict) -> DialectStream:
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


def require_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"'{param}' must be a string", param)
    return value


def require_list(value: Any, param: str) -> list:
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array", param)
    return value


def require_dict(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be an object", param)
    return value


def copy_sampling(body: dict, out: dict, names: dict[str, str]) -> None:
    """Copy the sampling fields this API shares with chat (`{their name: chat name}`), where given."""
    for theirs, ours in names.items():
        if body.get(theirs) is not None:
            out[ours] = body[theirs]


def request_model(body: Any) -> str:
    """The model a request names, once the body is known to be an object."""
    if not isinstance(body, dict):
        raise invalid(f"request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' must be a non-empty string", "model")
    return model


def chat_tools(body: dict, convert: Callable[[dict, int], list[dict]]) -> list[dict]:
    """The request's `tools` as chat function tools, `convert(tool, index)` giving each one's."""
    tools = require_list(body.get("tools") or [], "tools")
    return [fn for i, tool in enumerate(tools) for fn in convert(require_dict(tool, f"tools[{i}]"), i)]


def set_stream(body: dict, out: dict) -> None:
    """Stream as asked, with the usage chunk: both APIs report token counts in their closing event."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean", "stream")
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
