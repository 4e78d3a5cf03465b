"""vLLM's weight-sync server, assembled from one release's own code (`tests/vllm/loader.py`) and served by
uvicorn on 127.0.0.1, for `WeightSyncClient(backend="nccl")` to push to on a CPU.

The layers, from the HTTP request down, and where each comes from:
- routes: the release's RL route module and `serve/dev/cache/api_router.py`, included in a FastAPI app
  with the release's exception handlers (`serve/exception_handling/register.py`: a failed engine call
  is a plain Exception, so it becomes a 500 through Starlette's ServerErrorMiddleware, which then
  re-raises, and uvicorn closes the connection). `/server_info` and `/health` are imitated: the real
  ones dump a whole `VllmConfig` (`serve/dev/server_info/api_router.py`: `dtype` comes out as
  "torch.bfloat16", which is what a trainer reads) and answer 200;
- `app.state.engine_client`: an object whose weight-transfer, pause and version methods are
  `AsyncLLM`'s own (`v1/engine/async_llm.py`, taken out by ast);
- the engine core: one thread that runs utility calls one at a time, in arrival order, as
  `EngineCoreProc`'s busy loop does (`v1/engine/core.py`), so a call queues behind a stuck one; a
  failure comes back as `Exception("Call to <method> method failed: <error>")`
  (`_invoke_utility_method` in core.py, `_process_utility_output` in core_client.py). The weight version
  starts at "default" (core.py). A uniprocess executor runs `collective_rpc` on the worker
  (`v1/executor/uniproc_executor.py`, `run_method`);
- the worker: `Worker`'s weight-update methods from `v1/worker/gpu_worker.py`, with its bookkeeping
  (`_weight_update_active`), over vLLM's `NCCLWeightTransferEngine` (`nccl_engine.py`), whose NCCL
  group is `tests/vllm/wire.py`;
- the model: `tests/vllm/model.py`'s VllmModel, set up for vLLM's layerwise reload as vLLM's loader
  leaves a model (`record_metadata_for_reloading`, `model_executor/model_loader/utils.py`).

Failure injection (`Faults`): the model refuses one checkpoint name, the n-th receive buffer runs out
of memory, the engine's finish raises, or the server drops a route's connection after it acted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
import types
from collections.abc import Iterator
from typing import Any

import torch
from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response

from engine.in_process import serve_in_thread
from tests.vllm import wire
from tests.vllm.loader import ParallelConfig, Release
from tests.vllm.model import VllmModel

WORKER_METHODS = {"_check_weight_transfer_engine", "init_weight_transfer_engine", "start_weight_update",
                  "_start_weight_update", "update_weights", "finish_weight_update"}  # fmt: skip
"""`Worker` (v1/worker/gpu_worker.py) methods that run as written."""
ASYNC_LLM_METHODS = {"collective_rpc", "init_weight_transfer_engine", "start_weight_update", "update_weights",
                     "finish_weight_update", "update_weight_version", "get_weight_version", "pause_generation",
                     "resume_generation", "is_paused", "reset_prefix_cache"}  # fmt: skip
"""`AsyncLLM` (v1/engine/async_llm.py) methods that run as written."""


@dataclasses.dataclass
class Faults:
    refuse_name: str | None = None
    """The model's load_weights raises KeyError for this checkpoint name (an unknown parameter)."""
    oom_at_buffer: int | None = None
    """The n-th receive buffer the worker allocates (1-based) raises torch.OutOfMemoryError."""
    finish_raises: bool = False
    """The weight-transfer engine's finish_weight_update raises (e.g. a layer's post-load processing)."""
    cut_after: str | None = None
    """Path whose next call runs in vLLM but whose connection is dropped before the answer."""


class EngineCore:
    """One thread running utility calls in order (EngineCoreProc's busy loop)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.paused = False
        self.weight_version = "default"
        self.calls: queue.Queue = queue.Queue()
        self.log: list[str] = []
        self.thread = threading.Thread(target=self._loop, name="engine-core", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            name, args, kwargs, future = item
            self.log.append(name)
            try:
                future.set_result(getattr(self, name)(*args, **kwargs))
            except (
                Exception
            ) as exc:  # core.py: `output.failure_message = f"Call to {name} method failed: {str(e)}"`
                future.set_exception(Exception(f"Call to {name} method failed: {exc}"))

    def submit(self, name: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.calls.put((name, args, kwargs, future))
        return future

    def stop(self) -> None:
        self.calls.put(None)

    # utility methods (core.py), at the level of detail the weight sync sees them
    def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ):
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.paused = True

    pause_generation = pause_scheduler  # 0.33: pause_scheduler plus rejecting new requests in abort/wait

    def resume_scheduler(self) -> None:
        self.paused = False

    def is_scheduler_paused(self) -> bool:
        return self.paused

    def set_weight_version(self, weight_version: str) -> None:
        self.weight_version = weight_version

    def get_weight_version(self) -> str:
        return self.weight_version

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return True


class EngineCoreClient:
    """`<utility>_async(...)` awaits the utility call on the engine core (core_client.py)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def __getattr__(self, name: str) -> Any:
        utility = name.removesuffix("_async")

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.wrap_future(self.core.submit(utility, *args, **kwargs))

        return call


class _Renderer:
    async def clear_mm_cache_async(self) -> None:
        return None


class _ModelRunner:
    def reset_lora_state(self) -> None:
        return None


def _worker_class(release: Release) -> type:
    namespace = {
        "set_current_vllm_config": lambda config: contextlib.nullcontext(),
        "share_source_lm_heads": lambda model: None,
        "restore_quantized_lm_heads": lambda model, refresh=True: None,
    }
    methods = release.extract("vllm/v1/worker/gpu_worker.py", WORKER_METHODS, namespace, class_name="Worker")
    return type("Worker", (), dict(methods))


def _async_llm_class(release: Release) -> type:
    import warnings

    namespace = {"warnings": warnings, "asyncio": asyncio}
    methods = release.extract(
        "vllm/v1/engine/async_llm.py", ASYNC_LLM_METHODS, namespace, class_name="AsyncLLM"
    )
    return type("AsyncLLM", (), dict(methods))


class _CutAfter:
    """Pure ASGI middleware: lets the route run, then drops the connection before its answer (the
    first call to the engine's `faults.cut_after` only)."""

    def __init__(self, app: Any, server: VllmServer) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        faults = self.server.engine.faults
        if scope["type"] != "http" or scope["path"] != faults.cut_after:
            return await self.app(scope, receive, send)
        faults.cut_after = None

        async def swallow(message: dict) -> None:
            if message["type"] == "http.response.start":
                await send({**message, "headers": [(b"content-length", b"64")]})
            elif not message.get("more_body"):
                raise ConnectionResetError("connection dropped by the test before the answer")

        await self.app(scope, receive, swallow)


class VllmEngine:
    """One vLLM engine (one GPU rank): model, worker, engine core and AsyncLLM."""

    def __init__(self, release: Release, dtype: torch.dtype, faults: Faults) -> None:
        self.release, self.dtype, self.faults = release, dtype, faults
        self.received: list[list[str]] = []
        """The names of every update_info the worker received."""
        weight_utils = release.module("vllm.model_executor.model_loader.weight_utils")
        self.model = VllmModel(weight_utils.default_weight_loader, dtype)
        reload = release.module("vllm.model_executor.model_loader.reload")
        nccl_engine = release.module("vllm.distributed.weight_transfer.nccl_engine")
        config_module = release.module("vllm.config.weight_transfer")
        with release.active():
            reload.record_metadata_for_reloading(self.model)
        vllm_config = types.SimpleNamespace(
            parallel_config=ParallelConfig(), model_config=types.SimpleNamespace(dtype=dtype)
        )
        engine = nccl_engine.NCCLWeightTransferEngine(
            config_module.WeightTransferConfig(backend="nccl"), vllm_config, torch.device("cpu"), self.model
        )
        self._inject(engine)
        self.worker = _worker_class(release)()
        self.worker.__dict__.update(
            vllm_config=vllm_config, weight_transfer_engine=engine, _weight_update_active=False,
            _weight_update_is_draft=False, model_runner=_ModelRunner(),
        )  # fmt: skip
        self.core = EngineCore(self.worker)
        self.llm = _async_llm_class(release)()
        self.llm.__dict__.update(
            engine_core=EngineCoreClient(self.core), renderer=_Renderer(), vllm_config=vllm_config
        )

    def _inject(self, engine: Any) -> None:
        faults, model, allocations = self.faults, self.model, self.release.allocations
        receive, finish = engine.receive_weights, engine.finish_weight_update

        def receive_weights(update_info: Any) -> None:
            self.received.append(list(update_info.names))
            model.refuse = faults.refuse_name
            allocations.count, allocations.fail_at = 0, faults.oom_at_buffer
            try:
                receive(update_info)
            finally:
                allocations.fail_at = None

        def finish_weight_update() -> None:
            if faults.finish_raises:
                raise RuntimeError(
                    "process_weights_after_loading failed in layer model.norm (injected by the test)"
                )
            finish()

        engine.receive_weights, engine.finish_weight_update = receive_weights, finish_weight_update

    @property
    def paused(self) -> bool:
        return self.core.paused

    @property
    def weight_version(self) -> str:
        return self.core.weight_version

    @property
    def update_active(self) -> bool:
        return self.worker._weight_update_active


class VllmServer:
    """vLLM's RL routes over a `VllmEngine`; `fresh()` swaps in a new engine behind the same server."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self.engine = VllmEngine(release, torch.float32, Faults())
        self.app = self._app()
        self.url: str | None = None

    def fresh(self, *, dtype: torch.dtype = torch.float32, faults: Faults | None = None) -> VllmEngine:
        wire.close_all()  # whatever the last engine left blocked
        self.engine.core.stop()
        self.engine = VllmEngine(self.release, dtype, faults or Faults())
        self.app.state.engine_client = self.engine.llm
        return self.engine

    def _app(self) -> FastAPI:
        release = self.release
        app = FastAPI()
        app.state.engine_client = self.engine.llm
        app.state.args = types.SimpleNamespace(log_error_stack=False)
        app.include_router(release.routes.router)
        app.include_router(release.module("vllm.entrypoints.serve.dev.cache.api_router").router)

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/server_info")
        async def server_info(config_format: str = Query("text")) -> JSONResponse:
            config = {
                "model_config": {"dtype": str(self.engine.dtype)},
                "parallel_config": {"world_size": 1},
                "weight_transfer_config": {"backend": "nccl"},
            }  # as `--weight-transfer-config` sets it
            body = config if config_format == "json" else str(config)
            return JSONResponse({"vllm_config": body, "vllm_env": {}, "system_env": {}})

        release.module("vllm.entrypoints.serve.exception_handling.register").init_exception_handler(app)
        app.add_middleware(_CutAfter, server=self)
        return app

    @contextlib.contextmanager
    def serve(self) -> Iterator[VllmServer]:
        with self.release.active(), serve_in_thread(self.app, start_timeout_s=30) as url:
            self.url = url
            try:
                yield self
            finally:
                wire.close_all()
                self.engine.core.stop()
