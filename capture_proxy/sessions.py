"""Capture sessions: created, listed, read and closed in the store, cached in memory per key, and the
session keys agents send authenticated against them."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from capture_proxy.config import ProxyConfig, normalize_engine_url
from capture_proxy.errors import InvalidTraceError, ProxyRequestError
from capture_proxy.metrics import ProxyMetrics
from capture_proxy.models import (
    SessionCreate,
    SessionCreated,
    SessionInfo,
    SessionStatus,
    TrainingTrace,
    TrainingTurn,
)
from capture_proxy.responses import JSON
from capture_proxy.store import SessionRecord, TraceStore


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(slots=True)
class LiveSession:
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


class SessionRegistry:
    """The sessions of one service: their store records, and the running ones cached by key and id."""

    def __init__(self, config: ProxyConfig, store: TraceStore, metrics: ProxyMetrics):
        self.config = config
        self.store = store
        self.metrics = metrics
        self._by_hash: dict[str, LiveSession] = {}
        self._by_auth: dict[str, LiveSession] = {}
        """Authorization header -> session, for keys already found: no hashing per call."""
        self._by_id: dict[str, LiveSession] = {}

    @property
    def live_sessions(self) -> int:
        return len(self._by_hash)

    # -- lifecycle ----------------------------------------------------------------------------

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
            upstream_auth_header=spec.auth_header if spec.api_key else None,
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
        if self.store.is_sqlite:
            # One local INSERT (~0.1 ms of C): on the loop, as the turns are (store/writer.py). In a
            # thread, the GIL hand-offs cost more: a POST /sessions took 1.10 ms of CPU, 0.89 inline.
            self.store.create_session(record)
        else:
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

    # -- authentication -----------------------------------------------------------------------

    async def authenticate(self, authorization: str | None) -> LiveSession:
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

    async def _find(self, authorization: str | None) -> LiveSession:
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

    def _remember(self, r: SessionRecord) -> LiveSession:
        """Cache the session for its key and id. The first to arrive wins, so two concurrent first
        calls share one counter."""
        live = self._by_hash.setdefault(r.api_key_hash, self._live(r))
        self._by_id.setdefault(r.session_id, live)
        return live

    @staticmethod
    def _live(r: SessionRecord) -> LiveSession:
        headers = {"content-type": JSON}
        if r.upstream_api_key and r.upstream_auth_header:
            headers[r.upstream_auth_header.lower()] = r.upstream_api_key
        elif r.upstream_api_key:
            headers["authorization"] = f"Bearer {r.upstream_api_key}"
        return LiveSession(
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
