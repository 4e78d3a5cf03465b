"""A lean HTTP/1.1 transport for the proxy's httpx client: asyncio streams + httptools' C parser.

httpx's default transport parses responses with h11, in Python, one event per HTTP chunk; for a proxy
that relays a 64-token stream that is most of its CPU time. This transport keeps httpx's client API
(timeouts, errors, response streaming) and pools keep-alive connections per host, but parses with
httptools (the parser uvicorn uses) and hands the body on in whatever pieces arrive from the socket,
so several SSE events travel as one piece. Plain `http://` only; `https://` goes through httpx's own
transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httptools
import httpx

_READ = 256 * 1024


class _Parser:
    """httptools callbacks for one response."""

    __slots__ = ("headers", "body", "headers_done", "complete", "keep_alive", "parser")

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.headers_done = False
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # Asked now: llhttp forgets it once the message completes.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    __slots__ = ("reader", "writer", "key")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: tuple[str, int]):
        self.reader = reader
        self.writer = writer
        self.key = key

    def usable(self) -> bool:
        # An idle connection the server has closed (keep-alive timeout) shows EOF or a closing transport.
        return not self.writer.is_closing() and not self.reader.at_eof() and not self.reader._buffer  # noqa: SLF001

    def close(self) -> None:
        self.writer.close()


class _Body(httpx.AsyncByteStream):
    """The response body, read from the socket as the caller iterates."""

    def __init__(self, transport: FastHTTPTransport, conn: _Connection, parser: httptools.HttpResponseParser,
                 state: _Parser, request: httpx.Request, read_timeout: float | None):  # fmt: skip
        self._transport = transport
        self._conn = conn
        self._parser = parser
        self._state = state
        self._request = request
        self._timeout = read_timeout
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        state = self._state
        while True:
            if state.body:
                piece = b"".join(state.body) if len(state.body) > 1 else state.body[0]
                state.body.clear()
                yield piece
            if state.complete:
                break
            data = await _read(self._conn, self._timeout, self._request)
            if not data:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body", request=self._request
                )
            _feed(self._parser, data, self._request)
        self._done = True

    async def aclose(self) -> None:
        if (self._done or self._state.complete) and self._state.keep_alive:
            self._transport._release(self._conn)
        else:
            self._conn.close()


async def _read(conn: _Connection, timeout: float | None, request: httpx.Request) -> bytes:
    if conn.reader._buffer:  # noqa: SLF001 - bytes already here: no timer to arm
        return await conn.reader.read(_READ)
    try:
        async with asyncio.timeout(timeout):
            return await conn.reader.read(_READ)
    except TimeoutError as exc:
        conn.close()
        raise httpx.ReadTimeout(f"no bytes from the engine in {timeout} s", request=request) from exc
    except OSError as exc:
        conn.close()
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc


def _feed(parser: httptools.HttpResponseParser, data: bytes, request: httpx.Request) -> None:
    try:
        parser.feed_data(data)
    except httptools.HttpParserError as exc:
        raise httpx.RemoteProtocolError(f"malformed HTTP response: {exc}", request=request) from exc


class FastHTTPTransport(httpx.AsyncBaseTransport):
    """Pooled keep-alive HTTP/1.1 connections per (host, port); https falls back to httpx's transport."""

    def __init__(self, *, max_idle_per_host: int = 1024):
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host
        self._fallback = httpx.AsyncHTTPTransport()

    def _release(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) < self._max_idle and conn.usable():
            idle.append(conn)
        else:
            conn.close()

    async def _connect(
        self, key: tuple[str, int], timeout: float | None, request: httpx.Request
    ) -> _Connection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*key, limit=_READ), timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"connecting to {key[0]}:{key[1]} took over {timeout} s", request=request
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}", request=request) from exc
        return _Connection(reader, writer, key)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout") or {}
        key = (url.host, url.port or 80)
        head = _head(request)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.usable():
                conn.close()
                continue
            response = await self._exchange(conn, head, request, timeouts, reused=True)
            if response is not None:
                return response
        conn = await self._connect(key, timeouts.get("connect"), request)
        response = await self._exchange(conn, head, request, timeouts, reused=False)
        assert response is not None
        return response

    async def _exchange(
        self, conn: _Connection, head: bytes, request: httpx.Request, timeouts: dict, *, reused: bool
    ) -> httpx.Response | None:
        """Send the request and read up to the headers; None when a reused connection turned out stale."""
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        try:
            conn.writer.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.writer.write(body)
            await conn.writer.drain()
        except OSError as exc:
            conn.close()
            if reused:
                return None
            raise httpx.WriteError(f"{type(exc).__name__}: {exc}", request=request) from exc
        state = _Parser()
        parser = state.parser = httptools.HttpResponseParser(state)
        read_timeout = timeouts.get("read")
        received = False
        while not state.headers_done:
            try:
                data = await _read(conn, read_timeout, request)
            except httpx.ReadError:
                if reused and not received:
                    return None
                raise
            if not data:
                conn.close()
                if reused and not received:
                    return None  # the server closed the idle connection as we reused it
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            received = True
            _feed(parser, data, request)
        return httpx.Response(
            parser.get_status_code(),
            headers=state.headers,
            stream=_Body(self, conn, parser, state, request, read_timeout),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        await self._fallback.aclose()


def _head(request: httpx.Request) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


__all__ = ["FastHTTPTransport"]
