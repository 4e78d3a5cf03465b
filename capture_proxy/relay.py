"""Streamed agent calls: the engine's events relayed to the agent as they come, the turn recorded
before the last of them goes out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from starlette.responses import Response, StreamingResponse

from capture_proxy.calls import ModelCall
from capture_proxy.engine_client import EngineClient
from capture_proxy.errors import ProxyRequestError
from capture_proxy.recording import TurnRecorder
from capture_proxy.responses import SSE_HEADERS
from capture_proxy.streaming import SSEDecoder, StreamAssembler


class StreamRelay:
    """Relays one streamed call from the engine to the agent, assembling its turn on the way."""

    def __init__(self, engine: EngineClient, recorder: TurnRecorder):
        self._engine = engine
        self._recorder = recorder
        self._own_transport = engine.transport is not None

    async def stream(self, call: ModelCall) -> Response:
        try:
            resp = await self._engine.send(call)
        except httpx.HTTPError as exc:
            raise await self._recorder.transport_failure(call, exc, None) from exc
        policy_version = self._recorder.policy_version(resp.headers)
        if resp.status_code >= 400:
            content = await resp.aread()
            await resp.aclose()
            raise await self._recorder.engine_refusal(call, resp.status_code, content, policy_version)
        # Our own transport's body iterates straight from the socket; httpx's decoding layers are
        # only needed when the engine compresses (it does not, but another upstream might).
        direct = self._own_transport and "content-encoding" not in resp.headers
        chunks = aiter(resp.stream) if direct else resp.aiter_bytes()
        decoder = SSEDecoder()
        asm = StreamAssembler(call.endpoint, call.wants)
        first = b""
        # Hold the headers until the first event: a stream cut before it still gets a proper 502.
        try:
            while not first and not asm.done:
                first = asm.relay(decoder.feed(await anext(chunks)))
        except (StopAsyncIteration, httpx.HTTPError, ValueError) as exc:
            await resp.aclose()
            cause = (
                exc
                if not isinstance(exc, StopAsyncIteration)
                else ConnectionError("engine closed the stream")
            )
            raise await self._recorder.transport_failure(call, cause, policy_version) from exc
        return _EventStream(
            self._relay(call, resp, chunks, decoder, asm, first, policy_version),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    async def _relay(
        self,
        call: ModelCall,
        resp: httpx.Response,
        chunks: AsyncIterator[bytes],
        decoder: SSEDecoder,
        asm: StreamAssembler,
        first: bytes,
        policy_version: int | None,
    ) -> AsyncIterator[bytes]:
        pending = first
        try:
            while not asm.done and asm.error is None:
                if pending:
                    yield pending
                try:
                    data = await anext(chunks)
                except StopAsyncIteration:
                    raise ConnectionError("engine closed the stream before [DONE]") from None
                pending = asm.relay(decoder.feed(data))
            async for _ in chunks:  # the end of the HTTP body after [DONE]: the connection is then reusable
                pass
        except (httpx.HTTPError, ConnectionError, ValueError) as exc:
            failure = await self._recorder.transport_failure(call, exc, policy_version, asm.response())
            yield b"data: " + orjson.dumps(failure.body() | {"status_code": failure.status}) + b"\n\n"
            return
        finally:
            await resp.aclose()
        # The last chunks go out only once the turn is stored: an answered call is a recorded call.
        if asm.error is not None:
            message = f"engine reported an error mid-stream: {asm.error.get('message', asm.error)}"
            await self._recorder.transport_failure(
                call, ConnectionError(message), policy_version, asm.response()
            )
        else:
            try:
                await self._recorder.record(call, asm.response(), asm.capture(), policy_version)
            except ProxyRequestError as exc:
                yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
                return
        yield _Last(pending + b"data: [DONE]\n\n")


_WATCH_AFTER_S = 0.05
"""How long a stream runs before it starts watching for the agent's disconnect."""


class _Last(bytes):
    """The last bytes of an event stream: sent together with the end of the response."""


class _EventStream(StreamingResponse):
    """A StreamingResponse that watches for the agent's disconnect with one plain task instead of an
    anyio task group (which costs more per stream than relaying its events), and ends the response
    with its last events rather than an empty message after them. On a disconnect the stream stops
    where it is, as Starlette's does: the engine connection is closed, nothing recorded."""

    async def stream_response(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            if type(chunk) is _Last:
                await send({"type": "http.response.body", "body": bytes(chunk), "more_body": False})
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        loop = asyncio.get_running_loop()
        gone = False
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            streaming.cancel()

        def start_watching() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch())

        # A stream over within _WATCH_AFTER_S needs no watcher (an early disconnect is still seen
        # then, as the watcher's first receive returns it at once); most short calls end sooner.
        timer = loop.call_later(_WATCH_AFTER_S, start_watching)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            streaming.uncancel()
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
        if self.background is not None:
            await self.background()
