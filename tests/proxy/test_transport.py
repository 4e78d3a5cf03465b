"""The proxy's HTTP/1.1 client to engines (capture_proxy/transport.py) against a real socket server:
whole replies and streamed bodies arrive complete, keep-alive connections are reused, and a connection
the server dropped while idle, a silent server, a cut body or a refused connection each end the way
httpx's own transport would."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from capture_proxy.transport import FastHTTPTransport, request_head

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A plain asyncio TCP server whose handler writes raw HTTP; counts the connections it accepted."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            finally:
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def key(self) -> tuple[str, int]:
        assert self.server is not None
        return ("127.0.0.1", self.server.sockets[0].getsockname()[1])


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


def reply(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json", b"content-length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def post(transport: FastHTTPTransport, key: tuple[str, int], content: bytes, read_timeout: float = 5):
    head = request_head("POST", key[0], key[1], "/v1/chat/completions", {"content-type": "application/json"})
    return await transport.post(key, head, content, connect_timeout=5, read_timeout=read_timeout)


async def test_a_large_reply_arrives_whole_and_the_connection_is_kept_alive():
    big = b'{"x":"' + b"a" * 3_000_000 + b'"}'  # far past the buffer that pauses a streamed read

    async def handler(reader, writer):
        while True:
            try:
                body = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(reply(big if body == b"big" else body))
            await writer.drain()

    transport = FastHTTPTransport()
    async with Server(handler) as server:
        first = await post(transport, server.key, b"big")
        second = await post(transport, server.key, b'{"echo":1}')
        assert first.status_code == 200 and first.content == big
        assert second.content == b'{"echo":1}' and second.headers["content-type"] == "application/json"
        assert server.connections == 1
    await transport.aclose()


async def test_a_streamed_body_keeps_what_arrives_while_the_caller_holds_a_piece():
    events = [b"data: %d\n\n" % i for i in range(200)]

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for i, event in enumerate(events):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            if i % 50 == 0:
                await writer.drain()
                await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection open until the client is done

    transport = FastHTTPTransport()
    async with Server(handler) as server, httpx.AsyncClient(transport=transport, timeout=5) as client:
        url = f"http://{server.key[0]}:{server.key[1]}/v1/chat/completions"
        async with client.stream("POST", url, content=b"{}") as response:
            pieces = []
            async for piece in response.aiter_raw():
                pieces.append(piece)
                await asyncio.sleep(0.02)  # a slow reader: the rest of the stream arrives meanwhile
    assert b"".join(pieces) == b"".join(events)
    assert len(pieces) > 1


async def test_a_large_stream_read_slowly_pauses_the_socket_and_ends_complete():
    chunk = b"data: " + b"z" * 65_530 + b"\n\n"

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(reply(chunk * 64, b"connection: keep-alive"))  # 4 MB: well past the pause mark
        await writer.drain()
        await reader.read()

    transport = FastHTTPTransport()
    async with Server(handler) as server, httpx.AsyncClient(transport=transport, timeout=5) as client:
        url = f"http://{server.key[0]}:{server.key[1]}/v1/chat/completions"
        async with client.stream("POST", url, content=b"{}") as response:
            total = 0
            async for piece in response.aiter_raw():
                total += len(piece)
                await asyncio.sleep(0.001)
    assert total == len(chunk) * 64


async def test_a_connection_the_server_dropped_while_idle_is_replaced():
    async def handler(reader, writer):
        body = await read_request(reader)
        writer.write(reply(body))  # keep-alive by HTTP/1.1 default, then closed anyway
        await writer.drain()

    transport = FastHTTPTransport()
    async with Server(handler) as server:
        assert (await post(transport, server.key, b"1")).content == b"1"
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        assert (await post(transport, server.key, b"2")).content == b"2"
        assert server.connections == 2
    await transport.aclose()


async def test_a_silent_server_is_a_read_timeout():
    async def handler(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    transport = FastHTTPTransport()
    async with Server(handler) as server:
        with pytest.raises(httpx.ReadTimeout):
            await post(transport, server.key, b"{}", read_timeout=0.2)
    await transport.aclose()


async def test_a_body_cut_short_is_a_protocol_error():
    async def handler(reader, writer):
        await read_request(reader)
        writer.write(reply(b"0123456789")[:-4])
        await writer.drain()

    transport = FastHTTPTransport()
    async with Server(handler) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="before the response ended"):
            await post(transport, server.key, b"{}")
    await transport.aclose()


async def test_a_refused_connection_is_a_connect_error():
    async with Server(read_request) as server:
        key = server.key
    transport = FastHTTPTransport()
    with pytest.raises(httpx.ConnectError, match="cannot connect"):
        await post(transport, key, b"{}")
    await transport.aclose()
