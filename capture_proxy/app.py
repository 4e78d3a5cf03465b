"""The proxy's HTTP surface: agent routes (session key), admin routes (admin key), health and metrics.

`harbor serve` mounts `agent_router(service)` alone on its sandbox-facing port and calls the
service's Python API for admin work; `harbor proxy` serves `create_app(config, store)`, all routes.
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from typing import Literal

import orjson
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from capture_proxy.config import ProxyConfig
from capture_proxy.dialects import ANTHROPIC_MESSAGES, OPENAI_RESPONSES, Dialect, translate_call
from capture_proxy.errors import (
    InvalidSessionUpdate,
    InvalidTraceError,
    ProxyRequestError,
    SessionNotFound,
    StoreError,
)
from capture_proxy.gc_tuning import serving_gc
from capture_proxy.models import INT64_LIMIT, SessionCreate
from capture_proxy.responses import error_response, json_response
from capture_proxy.service import CaptureService
from capture_proxy.store import TraceStore

MAX_PAGE = 1000
"""Most sessions one `GET /sessions` returns; bounds also keep bad paging a 422, not a store error."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyRequestError(
            413,
            f"request body of {declared} bytes exceeds the proxy's limit of {limit} bytes",
            code="body_too_large",
        )
    if declared is not None and declared.isdigit():
        return await request.body()
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ProxyRequestError(
                413, f"request body exceeds the proxy's limit of {limit} bytes", code="body_too_large"
            )
        parts.append(part)
    return b"".join(parts)


async def sampling_call(
    service: CaptureService, request: Request, endpoint: Literal["chat", "completions"]
) -> Response:
    """One agent sampling call: its body read (within the size limit) and handed to the service."""
    try:
        raw = await read_body(request, service.config.max_body_bytes)
    except ClientDisconnect:
        service.metrics.error("client_disconnect")
        return Response(status_code=400)  # nobody is left to read it
    except ProxyRequestError as exc:
        service.metrics.error("bad_request")
        service.metrics.request(endpoint, exc.status)
        return error_response(exc)
    auth = request.headers.get("authorization")
    if endpoint == "chat":
        return await service.chat_completions(auth, raw)
    return await service.completions(auth, raw)


_SAMPLING_PATHS: dict[str, Literal["chat", "completions"]] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
}


class SamplingFastPath:
    """ASGI middleware that answers `POST` on the two sampling routes itself, the same way their
    routes do: FastAPI's routing and inner middleware cost more per call than a short call's own
    forwarding. Every other request goes on to the app."""

    def __init__(self, app: ASGIApp, service: CaptureService):
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = _SAMPLING_PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response = await sampling_call(self.service, Request(scope, receive), endpoint)
        await response(scope, receive, send)


def agent_router(service: CaptureService) -> APIRouter:
    """The routes agents call, authenticated by their session key: OpenAI's chat and completions, and
    Anthropic's Messages and OpenAI's Responses APIs translated onto chat."""
    router = APIRouter()

    async def chat_completions(request: Request) -> Response:
        return await sampling_call(service, request, "chat")

    async def completions(request: Request) -> Response:
        return await sampling_call(service, request, "completions")

    async def models(request: Request) -> Response:
        return await service.models(request.headers.get("authorization"))

    def translated(dialect: Dialect):
        async def route(request: Request) -> Response:
            try:
                raw = await read_body(request, service.config.max_body_bytes)
            except ClientDisconnect:
                service.metrics.error("client_disconnect")
                return Response(status_code=400)
            except ProxyRequestError as exc:
                service.metrics.error("bad_request")
                service.metrics.request(dialect.name, exc.status)
                return dialect.error(exc.status, exc.message, exc.code, exc.param)
            return await translate_call(service, dialect, request.headers, raw)

        return route

    # Plain Starlette routes: no dependency resolution on the hot path.
    router.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
    router.add_route("/v1/completions", completions, methods=["POST"])
    router.add_route("/v1/models", models, methods=["GET"])
    # Anthropic's Messages and OpenAI's Responses APIs, translated onto the chat path above.
    router.add_route("/v1/messages", translated(ANTHROPIC_MESSAGES), methods=["POST"])
    router.add_route("/v1/responses", translated(OPENAI_RESPONSES), methods=["POST"])
    return router


def admin_router(service: CaptureService, admin_key: str) -> APIRouter:
    """Session lifecycle behind the admin key."""
    router = APIRouter()

    def _check(request: Request) -> None:
        auth = request.headers.get("authorization") or ""
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), admin_key.encode()):
            raise ProxyRequestError(
                401, "admin routes need 'Authorization: Bearer <admin key>'", code="invalid_admin_key"
            )

    async def _guard(request: Request, action) -> Response:
        try:
            _check(request)
            return await action()
        except ProxyRequestError as exc:
            return error_response(exc)
        except SessionNotFound as exc:
            return error_response(ProxyRequestError(404, str(exc), code="session_not_found"))
        except InvalidSessionUpdate as exc:
            return error_response(ProxyRequestError(409, str(exc), code="invalid_session_update"))
        except StoreError as exc:  # e.g. the disk is full: say so rather than a bare 500
            return error_response(ProxyRequestError(503, str(exc), type="server_error", code="store_error"))
        except InvalidTraceError as exc:
            body = ProxyRequestError(409, str(exc), code="invalid_trace").body()
            body["findings"] = [f.model_dump(mode="json") for f in exc.findings]
            return json_response(body, 409)

    @router.post("/sessions")
    async def create_session(request: Request) -> Response:
        async def action() -> Response:
            raw = await read_body(request, 1024 * 1024)
            try:
                spec = SessionCreate.model_validate_json(raw)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or None
                raise ProxyRequestError(
                    422, f"invalid session spec: {where}: {first['msg']}", param=where, code="invalid_session"
                ) from exc
            base = service.config.public_base_url or str(request.base_url).rstrip("/") + "/v1"
            created = await service.create_session(spec, base_url=base)
            return json_response(created.model_dump(), 201)

        return await _guard(request, action)

    @router.get("/sessions")
    async def list_sessions(
        request: Request,
        status: str | None = None,
        purpose: str | None = None,
        task_id: str | None = None,
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        offset: int = Query(0, ge=0, lt=INT64_LIMIT),  # the store's OFFSET is a 64-bit integer
    ) -> Response:
        async def action() -> Response:
            infos = await service.list_sessions(
                status=status, purpose=purpose, task_id=task_id, limit=limit, offset=offset
            )
            return json_response([i.model_dump() for i in infos])

        return await _guard(request, action)

    @router.get("/sessions/{session_id}")
    async def get_session(request: Request, session_id: str) -> Response:
        async def action() -> Response:
            return json_response((await service.get_session(session_id)).model_dump())

        return await _guard(request, action)

    @router.get("/sessions/{session_id}/trace")
    async def get_trace(request: Request, session_id: str) -> Response:
        async def action() -> Response:
            trace = await service.get_trace(session_id)
            return Response(trace.model_dump_json(), media_type="application/json")

        return await _guard(request, action)

    @router.delete("/sessions/{session_id}")
    async def close_session(
        request: Request,
        session_id: str,
        status: Literal["completed", "cancelled", "failed", "timed_out"] = "completed",
    ) -> Response:
        async def action() -> Response:
            return json_response((await service.close_session(session_id, status)).model_dump())

        return await _guard(request, action)

    return router


def create_app(config: ProxyConfig, store: TraceStore, *, close_store: bool = False) -> FastAPI:
    """The standalone proxy: agent + admin routes, /health, /metrics. The service lives on `app.state.service`."""
    service = CaptureService(config, store)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        with serving_gc():
            yield
        await service.aclose()
        if close_store:
            store.close()

    app = FastAPI(title="Harbor-RL capture proxy", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.include_router(agent_router(service))
    app.include_router(admin_router(service, config.admin_key))
    app.add_middleware(SamplingFastPath, service=service)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return error_response(ProxyRequestError(422, f"{where}: {first['msg']}", param=where))

    @app.get("/health")
    async def health() -> Response:
        return Response(
            orjson.dumps({"status": "ok", "live_sessions": service.live_sessions}),
            media_type="application/json",
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(
            service.metrics.render(service.live_sessions), media_type="text/plain; version=0.0.4"
        )

    return app
