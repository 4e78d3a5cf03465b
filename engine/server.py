"""The embedded engine's HTTP app: vLLM's OpenAI dialect plus its weight-transfer endpoints.

`create_app(EngineConfig(...))` loads the model on start-up and runs the batching loop
(`scheduler.BatchScheduler`) in a background thread.

The weight-transfer routes mirror vLLM's (`vllm/entrypoints/serve/dev/rlhf/api_router.py` in vLLM 0.28.0,
`vllm/entrypoints/rl/online/api_router.py` in 0.33.0; the table in docs/design.md 3.9 lists each route
and where this engine differs): the same paths, bodies, answers and status codes (400 for a malformed
body, 500 for anything vLLM's engine refuses), the weight version a tag the trainer gives at
/finish_weight_update ("default" until then). `tests/engine/test_vllm_conformance.py` runs the same
calls against both releases' own route code and this engine. One addition vLLM does not make: every response carries the served tag in the
`x-policy-version` header (streams too: sent once the request has been admitted, so it names the
weights its first token was sampled with); readers must not rely on it, vLLM sends none.
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
)
from engine.protocol import POLICY_VERSION_HEADER, ChatRequest, CompletionRequest
from engine.scheduler import INITIAL_WEIGHT_VERSION

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
                    version = (
                        engine.scheduler.weight_version if engine is not None else INITIAL_WEIGHT_VERSION
                    )
                    headers.append((POLICY_VERSION_HEADER.encode(), version.encode()))
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

    @app.exception_handler(WeightTransferError)
    async def transfer_error(_: Request, exc: WeightTransferError) -> JSONResponse:
        # vLLM answers every failure inside its engine (out-of-order calls included) with a 500.
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
    """vLLM's routes as the trainer drives them; answers copied from vLLM 0.28.0-0.33.0's api_router."""

    @app.get("/get_world_size")
    async def get_world_size(request: Request, include_dp: bool = Query(True)) -> dict[str, int]:
        return {"world_size": engine(request).receiver.world_size}  # one rank: TP = PP = DP = 1

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request) -> dict[str, str]:
        info = _body_field(await _json_object(request), "init_info", dict)  # 0.33: dict[str, Any]
        await asyncio.to_thread(engine(request).receiver.init, info)
        return {"message": "Weight transfer initialized"}

    @app.post("/start_weight_update")
    async def start_weight_update(request: Request) -> dict[str, str]:
        engine(request).receiver.start()  # vLLM reads no body here
        return {"message": "Weight update started"}

    @app.post("/update_weights")
    async def update_weights(request: Request) -> dict[str, str]:
        info = _body_field(await _json_object(request), "update_info", dict)  # one engine rank: no list
        await asyncio.to_thread(engine(request).receiver.update, info)
        return {"message": "Weights updated"}

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request) -> dict[str, str]:
        # vLLM: `weight_version: Annotated[str | None, Body(embed=True)] = None`.
        version = _optional_tag(await _json_object(request), "weight_version")
        await asyncio.to_thread(engine(request).receiver.finish, version)
        return {"message": "Weight update finished"}

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> dict[str, Any]:
        version = _optional_tag(await _json_object(request), "new_version")
        if version is None:
            raise BadRequest("Missing 'new_version' in request body", param="new_version")
        engine(request).scheduler.set_weight_version(version)
        return {"success": True, "new_version": version}

    @app.get("/server_info")
    async def server_info(
        request: Request, config_format: Literal["text", "json"] = Query("text")
    ) -> dict[str, Any]:
        # The part of vLLM's resolved VllmConfig a trainer reads (TRL's VLLMClient.get_dtype takes
        # vllm_config.model_config.dtype, stringified as "torch.<dtype>" by vLLM's json dump).
        state = engine(request)
        config = {
            "model_config": {
                "model": str(state.model_path),
                "served_model_name": state.served_name,
                "dtype": str(next(state.scheduler.model.parameters()).dtype),
                "max_model_len": state.max_model_len,
            },
            "parallel_config": {"world_size": state.receiver.world_size},
            # vLLM's own field (`--weight-transfer-config`): a client on `auto` picks the backend from it.
            "weight_transfer_config": {"backend": "gloo"},
        }
        return {"vllm_config": config if config_format == "json" else str(config), "vllm_env": {},
                "system_env": {}}  # fmt: skip

    @app.get("/weight_info")
    async def weight_info(request: Request) -> dict[str, str]:
        return {"weight_version": engine(request).scheduler.weight_version}

    @app.post("/pause")
    async def pause(
        request: Request,
        mode: Literal["abort", "wait", "keep"] = Query("abort"),
        clear_cache: bool = Query(True),
    ) -> dict[str, str]:
        # keep (what the trainer sends): running requests freeze and go on under the new weights after
        # /resume; new ones queue. abort ends running requests (finish_reason "abort"); wait lets them
        # finish. New requests during abort/wait queue here as in vLLM 0.28 (0.33 answers them 503).
        # clear_cache empties the prefix cache once paused, as vLLM's does.
        scheduler = engine(request).scheduler
        await asyncio.to_thread(scheduler.pause, mode)
        if clear_cache:
            await asyncio.to_thread(scheduler.reset_prefix_cache)
        return {"status": "paused"}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> dict[str, bool]:
        # vLLM's development route (vllm/entrypoints/serve/dev/cache/api_router.py): {"success": bool},
        # false while blocks are held; the embedded cache holds none between steps.
        await asyncio.to_thread(engine(request).scheduler.reset_prefix_cache)
        return {"success": True}

    @app.post("/resume")
    async def resume(request: Request) -> dict[str, str]:
        engine(request).scheduler.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused(request: Request) -> dict[str, bool]:
        return {"is_paused": engine(request).scheduler.is_paused}


def _body_field(body: dict[str, Any], key: str, kind: type) -> Any:
    """A required body field: missing (or null) is a 400, as in both releases; the wrong JSON type a
    400, as 0.33's `Body(embed=True)` models answer (0.28 passed it on and its engine answered 500)."""
    value = body.get(key)
    if value is None:
        raise BadRequest(f"Missing '{key}' in request body", param=key)
    if not isinstance(value, kind):
        raise BadRequest(f"{key}: Input should be a valid dictionary", param=key)
    return value


def _optional_tag(body: dict[str, Any], key: str) -> str | None:
    """A `str | None` body field, as FastAPI's `Body(embed=True)` checks it for vLLM (a number is
    refused: FastAPI 0.1xx's str fields are strict about JSON numbers)."""
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{key}: Input should be a valid string", param=key)
    return value
