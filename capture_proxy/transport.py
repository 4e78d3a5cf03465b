"""A lean HTTP/1.1 client for the proxy's engine calls: asyncio protocols + httptools' C parser.

httpx's default transport parses responses with h11, in Python, one event per HTTP chunk; for a proxy
that relays a 64-token stream that is most of its CPU time. Here each pooled keep-alive connection is
an `asyncio.Protocol` whose bytes go straight into httptools (the parser uvicorn uses): no stream
reader, no task switch per read. Two ways in:

- `FastHTTPTransport.post()`: a whole non-streamed exchange, returning the status, headers and body.
  The proxy's non-streamed calls take this path: without httpx's request and response objects and
  stream readers a call cost ~10% less proxy CPU (A/B on one core, 512 prompt ids; BENCHMARKS.md).
- `FastHTTPTransport` as an httpx transport (timeouts, errors, response streaming), for streamed
  calls: the body is handed on in whatever pieces arrive from the socket, so several SSE events
  travel as one piece.

Errors are httpx's (`ConnectError`, `ReadTimeout`, `RemoteProtocolError`, ...) on both paths. Plain
`http://` only; `https://` goes through httpx's own transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httptools
import httpx

_PAUSE_ABOVE = 256 * 1024
"""Bytes of response body buffered before the socket stops being read (the reader is behind)."""

Key = tuple[str, int]
_TIMED_OUT = object()


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(_TIMED_OUT)


@dataclass(slots=True)
class Reply:
    """A whole engine reply."""

    status_code: int
    headers: httpx.Headers
    content: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one exchange at a time: the response's head and body as they are
    parsed, and a waiter woken whenever anything arrives."""

    def __init__(self, key: Key):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._start(None)

    def _start(self, parser: httptools.HttpResponseParser | None) -> None:
        self.parser = parser
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.buffered = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False
        self.streaming = False
        """Read by a caller that takes the body as it comes: the socket may pause while it is behind."""
        self.error: httpx.HTTPError | None = None

    def begin(self) -> None:
        """Get ready for the response to a request about to be written."""
        self._start(httptools.HttpResponseParser(self))

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.parser is None:  # bytes from an idle connection: it cannot be reused
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"malformed HTTP response: {exc}")
            self.close()
        if (
            self.streaming
            and self.buffered > _PAUSE_ABOVE
            and not self._paused
            and self.transport is not None
        ):
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    # -- httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # Asked now: llhttp forgets it once the message completes.
        self.keep_alive = self.parser.should_keep_alive()  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # -- for the exchange -------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def usable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def take_body(self) -> bytes:
        body = self.body
        piece = b"".join(body) if len(body) > 1 else body[0]
        body.clear()
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    async def wait(self, timeout: float | None) -> None:
        """Until more of the response arrives; ReadTimeout after `timeout` s of silence,
        RemoteProtocolError when the connection ends first."""
        if self.error is not None:
            raise self.error
        if self.lost:
            raise httpx.RemoteProtocolError(
                "engine closed the connection before the response ended"
                if self.headers_done
                else "Server disconnected without sending a response."
            )
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        # A bare timer rather than asyncio.timeout(): this runs once or twice per engine call.
        timer = loop.call_later(timeout, _time_out, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()
        if waiter.result() is _TIMED_OUT:
            self.close()
            raise httpx.ReadTimeout(f"no bytes from the engine in {timeout} s")
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    """A streamed response's body, read from the connection as the caller iterates."""

    def __init__(self, pool: FastHTTPTransport, conn: _Connection, read_timeout: float | None):
        self._pool = pool
        self._conn = conn
        self._timeout = read_timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:  # bytes may arrive while the caller holds a piece: the end counts once they are out
            if conn.body:
                yield conn.take_body()
            elif conn.complete:
                return
            else:
                await conn.wait(self._timeout)

    async def aclose(self) -> None:
        self._pool.release(self._conn)


class FastHTTPTransport(httpx.AsyncBaseTransport):
    """Pooled keep-alive HTTP/1.1 connections per (host, port); https falls back to httpx's transport."""

    def __init__(self, *, max_idle_per_host: int = 1024):
        self._idle: dict[Key, list[_Connection]] = {}
        self._max_idle = max_idle_per_host
        self._fallback = httpx.AsyncHTTPTransport()

    def release(self, conn: _Connection) -> None:
        """Back to the pool when its response ended and it may be kept alive; closed otherwise."""
        if conn.parser is None:  # released already
            return
        idle = self._idle.setdefault(conn.key, [])
        if conn.complete and conn.keep_alive and conn.usable() and len(idle) < self._max_idle:
            idle.append(conn)
        else:
            conn.close()
        conn.parser = None

    async def post(
        self,
        key: Key,
        head: bytes,
        content: bytes,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> Reply:
        """One whole exchange: `head` (request line and headers, without Content-Length) and
        `content` sent to `key`, the reply read to its end."""
        head += b"content-length: " + str(len(content)).encode() + b"\r\n\r\n"
        conn = await self._exchange(key, head, content, connect_timeout, read_timeout)
        try:
            while not conn.complete:
                await conn.wait(read_timeout)
            body = conn.take_body() if conn.body else b""
            return Reply(conn.parser.get_status_code(), httpx.Headers(conn.headers), body)  # type: ignore[union-attr]
        finally:
            self.release(conn)

    async def _exchange(
        self, key: Key, head: bytes, content: bytes, connect_timeout: float | None, read_timeout: float | None
    ) -> _Connection:
        """Send the request and wait for its response's head. A reused connection the server closed
        while it sat idle (its keep-alive timeout) is given up for the next one, or a new one."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable() and await self._send(conn, head, content, read_timeout, reused=True):
                return conn
            conn.close()
        conn = await self._connect(key, connect_timeout)
        await self._send(conn, head, content, read_timeout, reused=False)
        return conn

    async def _send(
        self, conn: _Connection, head: bytes, content: bytes, read_timeout: float | None, *, reused: bool
    ) -> bool:
        """Write the request and read up to the end of the response's head; False when a reused
        connection turned out to be closed before anything came back."""
        conn.begin()
        transport = conn.transport
        assert transport is not None
        try:
            if len(content) < 65536:
                transport.write(head + content)
            else:
                transport.writelines((head, content))
            while not conn.headers_done:
                await conn.wait(read_timeout)
        except (httpx.RemoteProtocolError, OSError) as exc:
            conn.close()
            if reused and not conn.received:
                return False
            if isinstance(exc, OSError):
                raise httpx.WriteError(f"{type(exc).__name__}: {exc}") from exc
            raise
        except BaseException:
            conn.close()
            raise
        return True

    async def _connect(self, key: Key, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(key), *key)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} took over {timeout} s") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from exc
        return conn

    # -- httpx.AsyncBaseTransport -----------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout") or {}
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        try:
            conn = await self._exchange(
                (url.host, url.port or 80),
                _head(request),
                body,
                timeouts.get("connect"),
                timeouts.get("read"),
            )
        except httpx.RequestError as exc:
            exc.request = request
            raise
        conn.streaming = True
        return httpx.Response(
            conn.parser.get_status_code(),  # type: ignore[union-attr]
            headers=conn.headers,
            stream=_Body(self, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        await self._fallback.aclose()


def request_head(method: str, host: str, port: int, path: str, headers: dict[str, str]) -> bytes:
    """An HTTP/1.1 request's line and headers for `FastHTTPTransport.post` (it adds Content-Length)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def _head(request: httpx.Request) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


__all__ = ["FastHTTPTransport", "Reply", "request_head"]
