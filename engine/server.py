"""The embedded engine's HTTP app: vLLM's OpenAI dialect plus its weight-transfer endpoints.

`create_app(EngineConfig(...))` loads the model on start-up and runs the batching loop
(`scheduler.BatchScheduler`) in a background thread. Every response carries the served weight version
in the `x-policy-version` header (streams too: the header is sent once the request has been admitted,
so it names the weights its first token was sampled with).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from engine import protocol, serving
from engine.config import EngineConfig, EngineState, load_engine
from engine.errors import (
    BadRequest,
    EngineError,
    EngineStopped,
    RequestError,
    WeightTransferError,
    WeightTransferStateError,
)
from engine.protocol import POLICY_VERSION_HEADER, ChatRequest, CompletionRequest

__all__ = ["EngineConfig", "create_app", "load_engine"]

log = logging.getLogger(__name__)


class _PolicyVersionHeader:
    """Pure ASGI middleware: adds the current weight version to any response that lacks one."""

    def __init__(self, app, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_version(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == POLICY_VERSION_HEADER.encode() for k, _ in headers):
                    engine = getattr(self.fastapi_app.state, "engine", None)
                    version = engine.scheduler.version if engine is not None else 0
                    headers.append((POLICY_VERSION_HEADER.encode(), str(version).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_version)


def _error(status: int, message: str, err_type: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, err_type, status, param), status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def request_error(_: Request, exc: RequestError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.err_type, exc.param)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where or 'body'}: {err.get('msg')}")
        first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
        param = str(first[1]) if len(first) > 1 else None
        return _error(400, "; ".join(parts) or "invalid request", "BadRequestError", param)

    @app.exception_handler(WeightTransferStateError)
    async def state_error(_: Request, exc: WeightTransferStateError) -> JSONResponse:
        return _error(409, str(exc), "ConflictError")

    @app.exception_handler(WeightTransferError)
    async def transfer_error(_: Request, exc: WeightTransferError) -> JSONResponse:
        return _error(500, str(exc), "InternalServerError")

    @app.exception_handler(EngineStopped)
    async def stopped(_: Request, exc: EngineStopped) -> JSONResponse:
        return _error(503, str(exc), "ServiceUnavailableError")

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return _error(500, str(exc), "InternalServerError")


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Invalid JSON format: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


# ---- the app --------------------------------------------------------------------------------------


def create_app(config: EngineConfig | None = None) -> FastAPI:
    """The engine as an ASGI app; the model loads when the app starts (lifespan)."""
    config = config or EngineConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state = await asyncio.to_thread(load_engine, config)
        state.scheduler.start()
        app.state.engine = state
        log.info(
            "serving %s as %r (max_model_len %d)", state.model_path, state.served_name, state.max_model_len
        )
        try:
            yield
        finally:
            await asyncio.to_thread(state.scheduler.stop)

    app = FastAPI(title="harbor engine", lifespan=lifespan)
    app.add_middleware(_PolicyVersionHeader, fastapi_app=app)
    _install_error_handlers(app)

    def engine(request: Request) -> EngineState:
        return request.app.state.engine

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        state = engine(request)
        card = protocol.ModelCard(
            id=state.served_name, root=str(state.model_path), max_model_len=state.max_model_len
        )
        return {"object": "list", "data": [card.model_dump()]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        return await serving.chat_completion(engine(request), body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completion(engine(request), body)

    _add_weight_routes(app, engine)
    return app


# ---- weight transfer (vLLM's native endpoints) ----------------------------------------------------


def _add_weight_routes(app: FastAPI, engine) -> None:
    @app.get("/get_world_size")
    async def get_world_size(request: Request) -> dict[str, int]:
        return {"world_size": engine(request).receiver.world_size}

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request) -> dict[str, str]:
        body = await _json_object(request)
        if body.get("init_info") is None:
            raise BadRequest("Missing 'init_info' in request body", param="init_info")
        await asyncio.to_thread(engine(request).receiver.init, body["init_info"])
        return {"message": "Weight transfer initialized"}

    @app.post("/start_weight_update")
    async def start_weight_update(request: Request) -> dict[str, str]:
        body = await _json_object(request)
        engine(request).receiver.start(bool(body.get("is_checkpoint_format", True)))
        return {"message": "Weight update started"}

    @app.post("/update_weights")
    async def update_weights(request: Request) -> dict[str, str]:
        body = await _json_object(request)
        if body.get("update_info") is None:
            raise BadRequest("Missing 'update_info' in request body", param="update_info")
        await asyncio.to_thread(engine(request).receiver.update, body["update_info"])
        return {"message": "Weights updated"}

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request) -> dict[str, Any]:
        version = await asyncio.to_thread(engine(request).receiver.finish)
        return {"message": "Weight update finished", "weight_version": version}

    @app.get("/weight_info")
    async def weight_info(request: Request) -> dict[str, Any]:
        return {"weight_version": engine(request).scheduler.version}

    @app.post("/pause")
    async def pause(
        request: Request, mode: Literal["abort", "wait", "keep"] = Query("abort")
    ) -> dict[str, str]:
        await asyncio.to_thread(engine(request).scheduler.pause, mode)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume(request: Request) -> dict[str, str]:
        engine(request).scheduler.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused(request: Request) -> dict[str, bool]:
        return {"is_paused": engine(request).scheduler.is_paused}
