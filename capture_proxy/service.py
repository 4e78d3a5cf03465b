"""CaptureService: capture sessions, and every agent model call forwarded to the engine and recorded.

The HTTP layer (`app.py`) only reads bodies and headers; everything else is here, so `harbor serve`
can mount the agent routes on its sandbox-facing port and drive sessions through this Python API.

Hot path per call: one dict lookup for the session key, one JSON parse of the request, one of the
engine's reply, one serialisation back, one awaited turn write. Nothing looks at earlier turns, so
the cost of a call does not grow with the session's length.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.responses import Response, StreamingResponse

from capture_proxy.config import ProxyConfig, normalize_engine_url
from capture_proxy.errors import (
    CaptureError,
    InvalidTraceError,
    ProxyRequestError,
    SessionNotFound,
    StoreError,
)
from capture_proxy.metrics import ProxyMetrics
from capture_proxy.models import (
    SessionCreate,
    SessionCreated,
    SessionInfo,
    SessionStatus,
    TrainingTrace,
    TrainingTurn,
    TurnMetadata,
)
from capture_proxy.store import AsyncTurnWriter, SessionRecord, TraceStore
from capture_proxy.streaming import SSEDecoder, StreamAssembler
from capture_proxy.transport import FastHTTPTransport
from capture_proxy.upstream import (
    Capture,
    Endpoint,
    Wants,
    capture_chat,
    capture_completion,
    rewrite_request,
    strip_for_agent,
    validate_request,
)

log = logging.getLogger(__name__)

JSON = "application/json"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
BUDGET_MESSAGE = (
    "The model-call budget of this session ({n} calls) is exhausted; no further model calls will be "
    "answered. Stop now and submit your work as it is."
)
_SAMPLING_ROUTES = {"chat": "/chat/completions", "completions": "/completions"}


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def error_response(exc: ProxyRequestError) -> Response:
    return json_response(exc.body(), exc.status)


def _upstream_error(status: int, message: str, code: str) -> ProxyRequestError:
    return ProxyRequestError(status, message, type="upstream_error", code=code)


@dataclass(slots=True)
class _Live:
    """What the hot path needs about a session, cached per key: no store read per call."""

    session_id: str
    purpose: str
    model: str
    sampling: dict
    max_model_calls: int
    status: str
    base: str
    headers: dict[str, str]
    key_hash: str
    calls: int = 0
    next_seq: int = 0
    failed: bool = False
    auth_headers: list[str] = field(default_factory=list)
    """The Authorization headers cached for this session, so closing it can drop them."""


@dataclass(slots=True)
class _Call:
    """One agent call in flight."""

    live: _Live
    seq: int
    endpoint: Endpoint
    request: dict
    upstream: dict
    sampling: dict
    wants: Wants
    streamed: bool
    started: float


class CaptureService:
    """Session lifecycle (admin API) and forwarding + capture of agent calls (agent API)."""

    def __init__(self, config: ProxyConfig, store: TraceStore, *, client: httpx.AsyncClient | None = None):
        self.config = config
        self.store = store
        self.writer = AsyncTurnWriter(store)
        self.metrics = ProxyMetrics()
        # The engine calls skip the client's cookie, auth and redirect handling (an engine needs
        # none of them) and go straight to its pooled transport; `client` replaces both.
        self._transport: FastHTTPTransport | None = None
        if client is None:
            self._transport = FastHTTPTransport(max_idle_per_host=config.max_upstream_connections)
            timeout = httpx.Timeout(
                config.read_timeout_s, connect=config.connect_timeout_s, pool=config.read_timeout_s
            )
            client = httpx.AsyncClient(timeout=timeout, transport=self._transport)
        self._client = client
        # Our own transport takes requests built directly: the client's URL, header and cookie
        # merging cost more than the rest of the forwarding.
        self._extensions = {"timeout": client.timeout.as_dict()}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._by_hash: dict[str, _Live] = {}
        self._by_auth: dict[str, _Live] = {}
        """Authorization header -> session, for keys already found: no hashing per call."""
        self._by_id: dict[str, _Live] = {}
        self._plain_upstreams: set[str] = set()
        """Upstream base URLs that refused vLLM's `return_token_ids` (not vLLM): eval calls omit it."""

    async def aclose(self) -> None:
        await self._client.aclose()
        await self.writer.aclose()

    # -- admin API ----------------------------------------------------------------------------

    async def create_session(
        self,
        spec: SessionCreate,
        *,
        base_url: str | None = None,
        task_id: str | None = None,
        harness: str | None = None,
        sandbox: str | None = None,
        owner: str | None = None,
    ) -> SessionCreated:
        """A new running session with a fresh key; `base_url` is where agents reach this service;
        `owner` names the server running it (SessionRecord.owner)."""
        llm_url = spec.llm_url or self.config.upstream_url
        if llm_url is None:
            raise ProxyRequestError(
                400,
                "no llm_url given and the proxy has no --upstream default",
                param="llm_url",
                code="no_upstream",
            )
        try:
            llm_url = normalize_engine_url(llm_url)
        except ValueError as exc:
            raise ProxyRequestError(400, str(exc), param="llm_url") from exc
        agent_base = base_url or self.config.public_base_url
        if agent_base is None:
            raise ValueError(
                "create_session needs base_url (or config.public_base_url): where agents reach the proxy"
            )
        key = "sk-harbor-" + secrets.token_urlsafe(32)
        record = SessionRecord(
            session_id=uuid.uuid4().hex,
            api_key_hash=hash_key(key),
            purpose=spec.purpose,
            model=spec.model,
            llm_url=llm_url,
            upstream_api_key=spec.api_key or (self.config.upstream_api_key if not spec.llm_url else None),
            # Eval sessions keep the agent's sampling but for what the creator set (upstream.rewrite_request).
            sampling=spec.sampling.model_dump(exclude_unset=spec.purpose != "train"),
            max_model_calls=spec.max_model_calls,
            multi_step_task=spec.multi_step_task,
            task_id=task_id,
            harness=harness,
            sandbox=sandbox,
            metadata=spec.metadata,
            created_at=time.time(),
            owner=owner,
        )
        await asyncio.to_thread(self.store.create_session, record)
        self._remember(record)
        self.metrics.sessions_created += 1
        return SessionCreated(
            session_id=record.session_id, api_key=key, base_url=normalize_engine_url(agent_base)
        )

    async def list_sessions(self, **filters: Any) -> list[SessionInfo]:
        records = await asyncio.to_thread(self.store.list_sessions, **filters)
        return [self._info(r) for r in records]

    async def get_session(self, session_id: str) -> SessionInfo:
        return self._info(await asyncio.to_thread(self.store.get_session, session_id))

    async def close_session(self, session_id: str, status: SessionStatus = "completed") -> SessionInfo:
        """End a session: its key stops working; its turns stay."""
        if status == "running":
            raise ProxyRequestError(
                400, "a session can only be closed with a terminal status", param="status"
            )
        record = await asyncio.to_thread(self.store.get_session, session_id)
        if record.status == "running":
            record = await asyncio.to_thread(self.store.update_session, session_id, status=status)
        live = self._by_id.pop(session_id, None)
        if live is not None:
            # Calls in flight hold `live` and see the end; later ones find the ended record in the
            # store (409), so a run of days does not keep every key it ever issued in memory.
            live.status = record.status
            self._by_hash.pop(live.key_hash, None)
            for header in live.auth_headers:
                self._by_auth.pop(header, None)
        return self._info(record)

    async def get_trace(self, session_id: str) -> TrainingTrace:
        """The finalized (roles, parents, masks) and validated trace; InvalidTraceError on any FATAL."""
        from capture_proxy.graph import finalize_trace
        from capture_proxy.validation import fatal, validate_trace

        record, turns = await asyncio.to_thread(self._load_trace, session_id)
        trace = record.trace(turns)
        findings = validate_trace(trace)
        if fatal(findings):
            raise InvalidTraceError(findings, session_id)
        return finalize_trace(trace)

    def _load_trace(self, session_id: str) -> tuple[SessionRecord, list[TrainingTurn]]:
        return self.store.get_session(session_id), self.store.get_turns(session_id)

    @staticmethod
    def _info(r: SessionRecord) -> SessionInfo:
        metadata = dict(r.metadata)
        if r.error:
            metadata["error"] = r.error
        return SessionInfo(
            session_id=r.session_id,
            status=r.status,
            purpose=r.purpose,
            model=r.model,
            llm_url=r.llm_url,
            max_model_calls=r.max_model_calls,
            num_turns=r.num_turns,
            created_at=r.created_at,
            finished_at=r.finished_at,
            metadata=metadata,
        )

    def _remember(self, r: SessionRecord) -> _Live:
        """Cache the session for its key and id. The first to arrive wins, so two concurrent first
        calls share one counter."""
        live = self._by_hash.setdefault(r.api_key_hash, self._live(r))
        self._by_id.setdefault(r.session_id, live)
        return live

    @staticmethod
    def _live(r: SessionRecord) -> _Live:
        headers = {"content-type": JSON}
        if r.upstream_api_key:
            headers["authorization"] = f"Bearer {r.upstream_api_key}"
        return _Live(
            session_id=r.session_id,
            purpose=r.purpose,
            model=r.model,
            sampling=r.sampling,
            max_model_calls=r.max_model_calls,
            status=r.status,
            base=r.llm_url,
            headers=headers,
            key_hash=r.api_key_hash,
            calls=r.num_turns,
            next_seq=r.num_turns,
            failed=r.error is not None,
        )

    @property
    def live_sessions(self) -> int:
        return len(self._by_hash)

    # -- agent API ----------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None) -> _Live:
        """The session of a `Bearer <session key>` header; 401 when unknown, 409 when it has ended."""
        live = self._by_auth.get(authorization)  # type: ignore[arg-type]
        if live is None:
            live = await self._find(authorization)
            if live.status == "running":
                self._by_auth[authorization] = live  # type: ignore[index]
                live.auth_headers.append(authorization)  # type: ignore[arg-type]
        if live.status != "running":
            self.metrics.error("session_ended")
            raise ProxyRequestError(
                409,
                f"session {live.session_id} is {live.status}; it takes no more model calls",
                code="session_ended",
            )
        return live

    async def _find(self, authorization: str | None) -> _Live:
        if not authorization or not authorization.startswith(("Bearer ", "bearer ")):
            self.metrics.error("unauthorized")
            raise ProxyRequestError(
                401, "missing session key: send it as 'Authorization: Bearer <key>'", code="invalid_api_key"
            )
        h = hash_key(authorization[7:].strip())
        live = self._by_hash.get(h)
        if live is None:
            record = await asyncio.to_thread(self.store.find_session_by_key_hash, h)
            if record is None:
                self.metrics.error("unauthorized")
                raise ProxyRequestError(401, "unknown session key", code="invalid_api_key")
            live = self._remember(record) if record.status == "running" else self._live(record)
        return live

    async def models(self, authorization: str | None) -> Response:
        try:
            live = await self.authenticate(authorization)
            try:
                resp = await self._client.get(live.base + "/models", headers=live.headers)
            except httpx.TimeoutException as exc:
                raise _upstream_error(
                    504, f"engine timed out listing models: {exc!r}", "upstream_timeout"
                ) from exc
            except httpx.HTTPError as exc:
                raise _upstream_error(
                    502, f"engine unreachable at {live.base}: {exc!r}", "upstream_error"
                ) from exc
            return Response(
                resp.content,
                status_code=502 if resp.status_code >= 500 else resp.status_code,
                media_type=JSON,
            )
        except ProxyRequestError as exc:
            self.metrics.request("models", exc.status)
            return error_response(exc)

    async def chat_completions(self, authorization: str | None, raw: bytes) -> Response:
        return await self._handle("chat", authorization, raw)

    async def completions(self, authorization: str | None, raw: bytes) -> Response:
        return await self._handle("completions", authorization, raw)

    async def _handle(self, endpoint: Endpoint, authorization: str | None, raw: bytes) -> Response:
        try:
            live = await self.authenticate(authorization)
            call = self._accept(live, endpoint, raw)
            if call is None:
                self.metrics.error("budget_exhausted")
                response = _budget_response(endpoint, live.max_model_calls, self._parse(raw))
            elif call.streamed:
                response = await self._stream(call)
            else:
                response = await self._forward(call)
        except ProxyRequestError as exc:
            if exc.status < 500:
                self.metrics.error("bad_request" if exc.status not in (401, 409) else "refused")
            response = error_response(exc)
        self.metrics.request(endpoint, response.status_code)
        return response

    @staticmethod
    def _parse(raw: bytes) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProxyRequestError(
                400, f"request body is not valid JSON: {exc}", code="invalid_json"
            ) from exc

    def _accept(self, live: _Live, endpoint: Endpoint, raw: bytes) -> _Call | None:
        """Validate and rewrite the request; None when the step budget is spent (nothing is recorded)."""
        body = self._parse(raw)
        validate_request(body, endpoint)
        if live.max_model_calls and live.calls >= live.max_model_calls:
            return None
        upstream, sampling, wants = rewrite_request(
            body, endpoint=endpoint, model=live.model, purpose=live.purpose, sampling=live.sampling
        )
        live.calls += 1
        seq = live.next_seq
        live.next_seq += 1
        return _Call(
            live,
            seq,
            endpoint,
            body,
            upstream,
            sampling,
            wants,
            bool(body.get("stream")),
            time.perf_counter(),
        )

    async def _send(self, call: _Call) -> httpx.Response:
        """POST the rewritten request to the engine; the response body is not read yet.

        An eval session may point at an OpenAI-compatible API that is not vLLM and refuses
        `return_token_ids`: the call is sent again without it (the turn is then kept without token
        ids, a warning for eval), and later eval calls to that upstream leave it out from the start.
        """
        base = call.live.base
        if call.live.purpose == "eval" and base in self._plain_upstreams:
            call.upstream.pop("return_token_ids", None)
        resp = await self._post(call)
        if resp.status_code == 400 and call.live.purpose == "eval" and "return_token_ids" in call.upstream:
            body = await resp.aread()
            await resp.aclose()
            if b"return_token_ids" not in body:
                return httpx.Response(400, content=body, headers=resp.headers)
            log.warning("upstream %s refuses return_token_ids; eval calls to it go without", base)
            self._plain_upstreams.add(base)
            call.upstream.pop("return_token_ids")
            resp = await self._post(call)
        return resp

    async def _post(self, call: _Call) -> httpx.Response:
        content = orjson.dumps(call.upstream)
        if self._transport is not None:
            key = (call.live.base, call.endpoint)
            url = self._urls.get(key)
            if url is None:
                url = self._urls[key] = httpx.URL(call.live.base + _SAMPLING_ROUTES[call.endpoint])
            request = httpx.Request(
                "POST", url, content=content, headers=call.live.headers, extensions=self._extensions
            )
            return await self._transport.handle_async_request(request)
        url = call.live.base + _SAMPLING_ROUTES[call.endpoint]
        request = self._client.build_request("POST", url, content=content, headers=call.live.headers)
        return await self._client.send(request, stream=True)

    # -- non-streamed calls -------------------------------------------------------------------

    async def _forward(self, call: _Call) -> Response:
        try:
            resp = await self._send(call)
            try:
                await resp.aread()
            finally:
                await resp.aclose()
        except httpx.HTTPError as exc:
            raise await self._transport_failure(call, exc, None) from exc
        policy_version = self._policy_version(resp.headers)
        if resp.status_code >= 400:
            raise await self._engine_refusal(call, resp.status_code, resp.content, policy_version)
        try:
            data = orjson.loads(resp.content)
            capture = capture_chat(data) if call.endpoint == "chat" else capture_completion(data)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise await self._transport_failure(
                call, ValueError(f"engine sent an unreadable reply: {exc!r}"), policy_version
            ) from exc
        strip_for_agent(data, call.wants)
        out = orjson.dumps(data)
        await self._record(call, data, capture, policy_version)
        return Response(out, media_type=JSON)

    # -- streamed calls -----------------------------------------------------------------------

    async def _stream(self, call: _Call) -> Response:
        try:
            resp = await self._send(call)
        except httpx.HTTPError as exc:
            raise await self._transport_failure(call, exc, None) from exc
        policy_version = self._policy_version(resp.headers)
        if resp.status_code >= 400:
            content = await resp.aread()
            await resp.aclose()
            raise await self._engine_refusal(call, resp.status_code, content, policy_version)
        # Our own transport's body iterates straight from the socket; httpx's decoding layers are
        # only needed when the engine compresses (it does not, but another upstream might).
        direct = self._transport is not None and "content-encoding" not in resp.headers
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
            raise await self._transport_failure(call, cause, policy_version) from exc
        return _EventStream(
            self._relay(call, resp, chunks, decoder, asm, first, policy_version),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    async def _relay(
        self,
        call: _Call,
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
            failure = await self._transport_failure(call, exc, policy_version, asm.response())
            yield b"data: " + orjson.dumps(failure.body() | {"status_code": failure.status}) + b"\n\n"
            return
        finally:
            await resp.aclose()
        # The last chunks go out only once the turn is stored: an answered call is a recorded call.
        if asm.error is not None:
            message = f"engine reported an error mid-stream: {asm.error.get('message', asm.error)}"
            await self._transport_failure(call, ConnectionError(message), policy_version, asm.response())
        else:
            try:
                await self._record(call, asm.response(), asm.capture(), policy_version)
            except ProxyRequestError as exc:
                yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
                return
        yield _Last(pending + b"data: [DONE]\n\n")

    # -- recording ----------------------------------------------------------------------------

    def _policy_version(self, headers: httpx.Headers) -> int | None:
        value = headers.get(self.config.policy_version_header)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    async def _record(
        self, call: _Call, response: dict, capture: Capture, policy_version: int | None
    ) -> None:
        """Write the turn and wait until it is committed: an answered call is a stored call."""
        latency = time.perf_counter() - call.started
        turn = self._turn(call, response, capture, policy_version, latency)
        try:
            await self.writer.write(call.live.session_id, call.seq, turn)
        except (StoreError, CaptureError) as exc:
            log.error("turn %s of session %s was not stored: %s", call.seq, call.live.session_id, exc)
            self.metrics.error("store_failure")
            raise ProxyRequestError(
                500,
                f"the trace store failed to record this call: {exc}",
                type="server_error",
                code="store_error",
            ) from exc
        self.metrics.turn(
            call.endpoint, capture.status, len(capture.prompt_ids), len(capture.completion_ids), latency
        )

    def _turn(
        self, call: _Call, response: dict, cap: Capture, policy_version: int | None, latency: float
    ) -> TrainingTurn:
        n_prompt, n_completion = len(cap.prompt_ids), len(cap.completion_ids)
        # A train turn keeps its completion marked trainable even when the capture failed, so the
        # validator refuses the trace instead of it silently training on nothing.
        trainable = cap.status == "ok" or call.live.purpose == "train"
        mask = [0] * n_prompt + [1 if trainable else 0] * n_completion
        metadata = TurnMetadata.model_construct(
            endpoint=call.endpoint,
            sampling=call.sampling,
            policy_version=policy_version,
            finish_reason=cap.finish_reason,
            latency_s=latency,
            parent_node_id=None,
            role="agent",
            capture=cap.status,
            error=cap.error,
            streamed=call.streamed,
            created_at=time.time(),
        )
        return TrainingTurn.model_construct(
            node_id=f"t{call.seq}",
            prompt_token_ids=cap.prompt_ids,
            completion_token_ids=cap.completion_ids,
            per_token_logps=cap.logps,
            loss_mask=mask,
            request=call.request,
            response=response,
            metadata=metadata,
        )

    async def _engine_refusal(
        self, call: _Call, status: int, content: bytes, policy_version: int | None
    ) -> ProxyRequestError:
        """An engine error reply: 5xx is a transport failure (502); 4xx is the agent's request, passed on."""
        try:
            err = orjson.loads(content).get("error")
            message = err.get("message") if isinstance(err, dict) else str(err)
        except (orjson.JSONDecodeError, AttributeError):
            message = content[:500].decode(errors="replace")
        if status >= 500:
            return await self._transport_failure(
                call, ConnectionError(f"engine answered {status}: {message}"), policy_version
            )
        # Nothing was sampled: the call does not count against the budget and nothing is recorded.
        call.live.calls -= 1
        self.metrics.error("engine_rejected")
        return ProxyRequestError(status, f"engine rejected the request: {message}", code="upstream_rejected")

    async def _transport_failure(
        self, call: _Call, exc: BaseException, policy_version: int | None, response: dict | None = None
    ) -> ProxyRequestError:
        """Record the call as a transport failure, flag the session (its reward becomes None), build the 502/504."""
        timeout = isinstance(exc, httpx.TimeoutException)
        status, code = (504, "upstream_timeout") if timeout else (502, "upstream_error")
        message = (
            f"engine call failed ({type(exc).__name__}): {exc}"
            if str(exc)
            else f"engine call failed: {exc!r}"
        )
        self.metrics.error("transport_timeout" if timeout else "transport_error")
        capture = Capture([], [], [], "transport_error", message, None)
        live = call.live
        live.failed = True
        try:
            await self._record(call, response or {}, capture, policy_version)
            await asyncio.to_thread(self.store.update_session, live.session_id, error=message)
        except (ProxyRequestError, StoreError) as store_exc:
            log.error("could not record transport failure of session %s: %s", live.session_id, store_exc)
        return _upstream_error(status, message, code)


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


def _budget_response(endpoint: Endpoint, n: int, body: dict) -> Response:
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


__all__ = ["CaptureService", "SessionNotFound", "error_response", "hash_key", "json_response"]
