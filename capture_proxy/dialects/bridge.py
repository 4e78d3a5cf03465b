"""One agent call in another dialect: translated to chat, captured by the chat path, translated back.

The chat path (`CaptureService.chat_completions`) is used as it is: it admits the call, sends it to the
engine, records the turn before the last event goes out, and answers 4xx/5xx on failure. This module
only rewrites what goes in and what comes out, so a Messages or Responses turn is captured exactly as a
chat turn is, and a stream's closing events still leave only once its turn is stored.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response, StreamingResponse

from capture_proxy.calls import forwarded, parse_body
from capture_proxy.dialects.base import Dialect, DialectStream
from capture_proxy.errors import ProxyRequestError
from capture_proxy.responses import SSE_HEADERS
from capture_proxy.streaming import DONE, SSEDecoder

if TYPE_CHECKING:
    from capture_proxy.service import CaptureService

log = logging.getLogger(__name__)


async def translate_call(service: CaptureService, dialect: Dialect, headers: Headers, raw: bytes) -> Response:
    """Answer one agent call of `dialect` through the chat capture path."""
    try:
        request, chat, content = _chat_request(dialect, raw)
    except ProxyRequestError as exc:
        service.metrics.error("bad_request")
        service.metrics.request(dialect.name, exc.status)
        return dialect.error(exc.status, exc.message, exc.code, exc.param)
    reply = await service.chat_completions(dialect.authorization(headers), content, dialect=dialect.name)
    if reply.status_code >= 400:
        return _error_from_chat(dialect, reply)
    if not chat.get("stream"):
        return _translated_reply(dialect, reply, request)
    return StreamingResponse(
        _translated(_chunks_of(reply), dialect.stream(request)),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


def _chat_request(dialect: Dialect, raw: bytes) -> tuple[Any, dict, bytes]:
    """The agent's request, checked, and the chat request it becomes (and its JSON); ProxyRequestError
    (400) if either cannot be: a body that does not fit the dialect's shape, or one nested too deeply."""
    body = parse_body(raw)
    # The chat path refuses what orjson cannot write back (254 levels; it reads 1024). A dialect turns a
    # tool's `input` into an arguments string, which would carry any depth, but only as far as
    # `json.dumps` recurses: that depends on sys.getrecursionlimit(), which imported packages change (jedi
    # sets 3000). Checking the body as parsed gives every route the same limit, whatever the process.
    forwarded(body)
    request = dialect.parse(body)
    chat = dialect.to_chat(request)
    return request, chat, forwarded(chat)


def _translated_reply(dialect: Dialect, reply: Response, request: Any) -> Response:
    """A non-streamed reply in the agent's dialect. The call is answered and stored by now; a reply the
    translation cannot read (a bug, or an engine reply of an odd shape) is a 502, never a bare 500."""
    try:
        body = orjson.dumps(dialect.from_chat(orjson.loads(reply.body), request))
    except Exception as exc:  # whatever failed, the agent gets an answer in its dialect
        log.exception("%s: could not translate the engine's reply", dialect.name)
        return dialect.error(502, f"the capture proxy could not translate the engine's reply: {exc!r}", None)
    return Response(body, media_type="application/json")


def _error_from_chat(dialect: Dialect, reply: Response) -> Response:
    """The chat path's OpenAI-style error, in the agent's dialect with the same status."""
    try:
        error = orjson.loads(reply.body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        error = {}
    message = error.get("message") or f"the capture proxy answered {reply.status_code}"
    return dialect.error(reply.status_code, message, error.get("code"), error.get("param"))


async def _chunks_of(reply: Response) -> AsyncIterator[bytes]:
    """The chat reply's SSE bytes: a live relay, or a whole body the proxy wrote itself (the step budget)."""
    if isinstance(reply, StreamingResponse):
        source = reply.body_iterator
        try:
            async for piece in source:
                yield piece if isinstance(piece, bytes) else str(piece).encode()
        finally:
            # A disconnected agent ends the relay too: its engine connection closes, nothing is recorded.
            await source.aclose()  # type: ignore[attr-defined]
    else:
        yield bytes(reply.body)


async def _translated(chunks: AsyncIterator[bytes], stream: DialectStream) -> AsyncIterator[bytes]:
    """The agent's events for a chat stream: opened at once, closed at `[DONE]` (after the turn is
    stored), or ended by one error event when the relay reports a failure. The stream always ends with
    one of the two, so the agent never sees a dropped connection: should the translation itself fail,
    the chat stream is still read to its end (its turn is recorded as for any call), and the error
    event follows."""
    decoder = SSEDecoder()
    try:
        yield stream.start()
        async for piece in chunks:
            out = []
            for payload in decoder.feed(piece):
                if payload == DONE:
                    yield b"".join(out) + stream.finish()
                    return
                chunk = orjson.loads(payload)
                if "error" in chunk:
                    yield b"".join(out) + stream.fail(*_stream_error(chunk))
                    return
                out.append(stream.feed(chunk))
            if out:
                yield b"".join(out)
        yield stream.fail(502, "the engine's stream ended before it was complete")
    except Exception as exc:  # the agent gets its dialect's error event, whatever failed
        log.exception("could not translate the engine's stream")
        with contextlib.suppress(Exception):
            async for _ in chunks:
                pass
        yield stream.fail(502, f"the capture proxy could not translate the engine's stream: {exc!r}")
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def _stream_error(chunk: dict) -> tuple[int, str]:
    """The status and message of the chat relay's error event."""
    error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
    status = chunk.get("status_code")
    return (status if isinstance(status, int) else 502), str(error.get("message") or error)
