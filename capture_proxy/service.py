"""CaptureService: capture sessions, and every agent model call forwarded to the engine and recorded.

The HTTP layer (`app.py`) only reads bodies and headers; everything else is behind this facade, so
`harbor serve` can mount the agent routes on its sandbox-facing port and drive sessions through this
Python API. The work itself is done by `sessions` (lifecycle, keys), `calls` (admission),
`forwarding` and `relay` (non-streamed and streamed calls, over `engine_client`; `replay` for streams
under `stream_mode = "replay"`) and `recording`.

Hot path per call: one dict lookup for the session key, one JSON parse of the request, one of the
engine's reply, one serialisation back, one awaited turn write. Nothing looks at earlier turns, so
the cost of a call does not grow with the session's length.
"""

from __future__ import annotations

from typing import Any

import httpx
from starlette.responses import Response

from capture_proxy.budget import budget_response
from capture_proxy.calls import accept_call, parse_body
from capture_proxy.config import ProxyConfig
from capture_proxy.engine_client import EngineClient
from capture_proxy.errors import ProxyRequestError
from capture_proxy.forwarding import Forwarder
from capture_proxy.metrics import ProxyMetrics
from capture_proxy.models import SessionCreate, SessionCreated, SessionInfo, SessionStatus, TrainingTrace
from capture_proxy.recording import TurnRecorder
from capture_proxy.relay import StreamRelay
from capture_proxy.responses import error_response
from capture_proxy.sessions import LiveSession, SessionRegistry
from capture_proxy.store import TraceStore, turn_writer
from capture_proxy.upstream import Endpoint


class CaptureService:
    """Session lifecycle (admin API) and forwarding + capture of agent calls (agent API)."""

    def __init__(self, config: ProxyConfig, store: TraceStore, *, client: httpx.AsyncClient | None = None):
        self.config = config
        self.store = store
        self.writer = turn_writer(store)
        self.metrics = ProxyMetrics()
        self._sessions = SessionRegistry(config, store, self.metrics)
        self._engine = EngineClient(config, client)
        recorder = TurnRecorder(config, store, self.writer, self.metrics)
        self._forwarder = Forwarder(self._engine, recorder)
        self._relay = StreamRelay(self._engine, recorder)
        self._replay_streams = config.stream_mode == "replay"

    async def aclose(self) -> None:
        await self._engine.aclose()
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
        return await self._sessions.create_session(
            spec, base_url=base_url, task_id=task_id, harness=harness, sandbox=sandbox, owner=owner
        )

    async def list_sessions(self, **filters: Any) -> list[SessionInfo]:
        return await self._sessions.list_sessions(**filters)

    async def get_session(self, session_id: str) -> SessionInfo:
        return await self._sessions.get_session(session_id)

    async def close_session(self, session_id: str, status: SessionStatus = "completed") -> SessionInfo:
        """End a session: its key stops working; its turns stay."""
        return await self._sessions.close_session(session_id, status)

    async def get_trace(self, session_id: str) -> TrainingTrace:
        """The finalized (roles, parents, masks) and validated trace; InvalidTraceError on any FATAL."""
        return await self._sessions.get_trace(session_id)

    @property
    def live_sessions(self) -> int:
        return self._sessions.live_sessions

    # -- agent API ----------------------------------------------------------------------------

    async def authenticate(self, authorization: str | None) -> LiveSession:
        """The session of a `Bearer <session key>` header; 401 when unknown, 409 when it has ended."""
        return await self._sessions.authenticate(authorization)

    async def models(self, authorization: str | None) -> Response:
        try:
            live = await self._sessions.authenticate(authorization)
            return await self._engine.list_models(live)
        except ProxyRequestError as exc:
            self.metrics.request("models", exc.status)
            return error_response(exc)

    async def chat_completions(
        self, authorization: str | None, raw: bytes, *, dialect: str | None = None
    ) -> Response:
        """A chat call; `dialect` names the API the agent spoke when the call was translated from
        another one (`capture_proxy.dialects`), recorded on its turn."""
        return await self._handle("chat", authorization, raw, dialect)

    async def completions(self, authorization: str | None, raw: bytes) -> Response:
        return await self._handle("completions", authorization, raw)

    async def _handle(
        self, endpoint: Endpoint, authorization: str | None, raw: bytes, dialect: str | None = None
    ) -> Response:
        try:
            live = await self._sessions.authenticate(authorization)
            call = accept_call(live, endpoint, raw, dialect, replay_streams=self._replay_streams)
            if call is None:
                self.metrics.error("budget_exhausted")
                response = budget_response(endpoint, live.max_model_calls, parse_body(raw))
            elif call.streamed and not self._replay_streams:
                response = await self._relay.stream(call)
            else:
                response = await self._forwarder.forward(call)
        except ProxyRequestError as exc:
            if exc.status < 500:
                self.metrics.error("bad_request" if exc.status not in (401, 409) else "refused")
            response = error_response(exc)
        self.metrics.request(endpoint, response.status_code)
        return response


__all__ = ["CaptureService"]
