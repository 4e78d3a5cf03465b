"""An agent's model call admitted for the engine: its body parsed and checked, counted against the
session's budget, numbered, and rewritten into the request the engine gets."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from capture_proxy.errors import ProxyRequestError
from capture_proxy.sessions import LiveSession
from capture_proxy.upstream import Endpoint, Wants, rewrite_request, validate_request


@dataclass(slots=True)
class ModelCall:
    """One agent call in flight."""

    live: LiveSession
    seq: int
    endpoint: Endpoint
    request: dict
    upstream: dict
    content: bytes
    """`upstream` as the JSON the engine gets."""
    sampling: dict
    wants: Wants
    streamed: bool
    started: float
    dialect: str | None = None
    """The API the agent spoke when its call was translated to chat (`capture_proxy.dialects`)."""


def parse_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProxyRequestError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc


def forwarded(upstream: dict) -> bytes:
    """The request as the engine gets it. orjson writes at most 254 levels of nesting and reads 1024, so
    a body can parse and still not be forwarded (or stored): that is the agent's 400, not a crash."""
    try:
        return orjson.dumps(upstream)
    except orjson.JSONEncodeError as exc:
        raise ProxyRequestError(
            400, f"request body cannot be forwarded: {exc} (nested too deeply?)", code="invalid_request"
        ) from exc


def accept_call(
    live: LiveSession,
    endpoint: Endpoint,
    raw: bytes,
    dialect: str | None = None,
    *,
    replay_streams: bool = False,
) -> ModelCall | None:
    """Validate and rewrite the request; None when the step budget is spent (nothing is recorded).
    `replay_streams`: a streamed call is sent to the engine unstreamed, and replayed to the agent."""
    body = parse_body(raw)
    validate_request(body, endpoint)
    if live.max_model_calls and live.calls >= live.max_model_calls:
        return None
    upstream, sampling, wants = rewrite_request(
        body,
        endpoint=endpoint,
        model=live.model,
        purpose=live.purpose,
        sampling=live.sampling,
        replay_stream=replay_streams,
    )
    content = forwarded(upstream)
    live.calls += 1
    seq = live.next_seq
    live.next_seq += 1
    return ModelCall(
        live,
        seq,
        endpoint,
        body,
        upstream,
        content,
        sampling,
        wants,
        bool(body.get("stream")),
        time.perf_counter(),
        dialect,
    )
