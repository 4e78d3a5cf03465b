"""The two HTTP faces of `harbor serve`.

- Trainer-facing (`--port`, 8200): health, info, tasks, rollouts (start, state, long poll, result,
  validated trace, cancel). Typed with the models in `models.py`, so /openapi.json describes it.
- Sandbox-facing (`--capture-port`, 8300): ONLY the capture proxy's agent routes (session key) and
  /health. No admin route and nothing of the trainer API is reachable from a sandbox.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from capture_proxy.app import SamplingFastPath, agent_router
from capture_proxy.models import INT64_LIMIT, TrainingTrace
from harbor_server.errors import HarborServerError
from harbor_server.models import (
    ErrorBody,
    Health,
    RolloutRequest,
    RolloutResult,
    RolloutState,
    RolloutStatus,
    ServerInfo,
    TaskInfo,
    TaskPage,
)

if TYPE_CHECKING:
    from capture_proxy.service import CaptureService
    from harbor_server.rollouts import RolloutManager
    from tasks import Task

log = logging.getLogger(__name__)

MAX_WAIT_S = 300.0
"""Longest a single long poll may hold the connection."""
MAX_PAGE = 1000

_ERRORS = {
    400: {"model": ErrorBody, "description": "Bad request: the message names the field and the value"},
    404: {"model": ErrorBody, "description": "No such rollout, split or task"},
    409: {"model": ErrorBody, "description": "Not finished yet, or the trace has FATAL findings (listed)"},
    429: {"model": ErrorBody, "description": "MAX_CONCURRENT_ENVS rollouts are already live"},
}


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


class ServedRollouts(Protocol):
    """What the trainer-facing API needs of the server (HarborServer is one)."""

    version: str
    manager: RolloutManager

    async def info(self) -> ServerInfo: ...
    def task_info(self, split: str, task: Task, index: int) -> TaskInfo: ...


def create_api_app(server: ServedRollouts) -> FastAPI:
    """The trainer-facing REST API over `server` (already started, or started by the caller)."""
    app = FastAPI(
        title="Harbor-RL rollout server",
        version=server.version,
        description="Start agent rollouts on Harbor tasks, wait for them, fetch rewards and validated traces.",
    )

    @app.exception_handler(HarborServerError)
    async def _server_error(request: Request, exc: HarborServerError) -> JSONResponse:
        body = ErrorBody(detail=exc.message)
        if exc.status == 409 and isinstance(exc.detail, list):
            body.findings = exc.detail
        return JSONResponse(body.model_dump(exclude_none=True), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        # Constant work and no I/O: trainers poll this while hundreds of rollouts run.
        return Health(live_rollouts=server.manager.live_count)

    @app.get("/info", response_model=ServerInfo)
    async def info() -> ServerInfo:
        return await server.info()

    @app.get("/tasks", response_model=TaskPage, responses=_ERRORS)
    async def tasks(
        split: str = Query(description="Dataset split (see /info)"),
        offset: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=MAX_PAGE),
    ) -> TaskPage:
        dataset = server.manager.dataset(split)
        window = range(offset, min(len(dataset), offset + limit))
        items = [server.task_info(split, dataset[i], i) for i in window]
        return TaskPage(split=split, offset=offset, limit=limit, total=len(dataset), tasks=items)

    @app.get("/tasks/{split}/{task_id}", response_model=TaskInfo, responses=_ERRORS)
    async def task(split: str, task_id: str) -> TaskInfo:
        dataset = server.manager.dataset(split)
        index = dataset.ids.index(task_id) if task_id in dataset.ids else None
        if index is None:
            raise HarborServerError(f"split {split!r} has no task {task_id!r}", status=404)
        return server.task_info(split, dataset[index], index)

    @app.post("/rollouts", response_model=RolloutState, status_code=201, responses=_ERRORS)
    async def start_rollout(request: RolloutRequest) -> RolloutState:
        return await server.manager.submit(request)

    @app.get("/rollouts", response_model=list[RolloutState])
    async def list_rollouts(
        status: RolloutStatus | None = None,
        task_id: str | None = None,
        limit: int = Query(100, ge=1, le=MAX_PAGE),
        offset: int = Query(0, ge=0, lt=INT64_LIMIT),  # the store's OFFSET is a 64-bit integer
    ) -> list[RolloutState]:
        """Rollouts in the store, newest first (also those of earlier server runs)."""
        return await server.manager.list(status=status, task_id=task_id, limit=limit, offset=offset)

    @app.get("/rollouts/{rollout_id}", response_model=RolloutState, responses=_ERRORS)
    async def get_rollout(rollout_id: str) -> RolloutState:
        return await server.manager.get(rollout_id)

    @app.get("/rollouts/{rollout_id}/wait", response_model=RolloutState, responses=_ERRORS)
    async def wait_rollout(
        rollout_id: str,
        timeout: float = Query(30.0, ge=0, le=MAX_WAIT_S, description="Seconds to hold the poll"),
    ) -> RolloutState:
        return await server.manager.wait(rollout_id, timeout)

    @app.get("/rollouts/{rollout_id}/result", response_model=RolloutResult, responses=_ERRORS)
    async def rollout_result(rollout_id: str) -> RolloutResult:
        return await server.manager.result(rollout_id)

    @app.get("/rollouts/{rollout_id}/trace", response_model=TrainingTrace, responses=_ERRORS)
    async def rollout_trace(rollout_id: str) -> Response:
        trace = await server.manager.trace(rollout_id)
        return Response(trace.model_dump_json(), media_type="application/json")

    @app.post("/rollouts/{rollout_id}/cancel", response_model=RolloutState, responses=_ERRORS)
    async def cancel_rollout(rollout_id: str) -> RolloutState:
        return await server.manager.cancel(rollout_id)

    return app


def create_capture_app(service: CaptureService) -> FastAPI:
    """The sandbox-facing port: agent routes (session key) and /health, nothing else."""
    app = FastAPI(title="Harbor-RL capture port", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(agent_router(service))
    app.add_middleware(SamplingFastPath, service=service)  # as the standalone proxy: less per call

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app
