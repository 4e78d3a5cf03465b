"""Python client of `harbor serve`, for trainers and evaluations.

    factory = HarborSessionFactory("http://localhost:8200", split="builtin", harness="oracle",
                                   sandbox="local", llm_url="http://localhost:8000/v1", model="tiny")
    session = factory.create(0, seed=1, episode_id="step0-g0")
    result = session.verify()            # waits, then VerifyResult(env_reward, metrics)
    trace = session.fetch_training_trace()
    session.close()

The trainer gets `functools.partial(HarborSessionFactory, url, split=..., ...)` and calls it with its
own sampling policy. Every method has an async twin (`AsyncHarborSessionFactory`, ...). Errors are
the server's own classes (`harbor_server.errors`), rebuilt from its answer.

Several servers (sharing one trace store) behind one trainer: give the factory all their URLs, as a
list or one comma-separated string. Each new session goes to the server with the fewest of this
factory's sessions still live (round-robin among ties); one that answers 429 or cannot be reached is
skipped for the next, and the error names every server only when none takes the rollout.

This module holds only the sending, sync and async; what the twins share is in
`harbor_server.client_base` and `harbor_server.client_spread`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import httpx

from capture_proxy.models import TrainingTrace
from harbor_server.client_base import (
    LONG_POLL_S,
    PAGE_SIZE,
    BaseHarborClient,
    BaseHarborSession,
    BaseHarborSessionFactory,
    Call,
    Endpoints,
    TaskCatalog,
    TaskRef,
    VerifyResult,
    is_prompt,
    prompt_row,
    raise_for_status,
    task_reference,
    task_selector,
    verify_result,
)
from harbor_server.client_spread import UNREACHABLE_BACKOFF_S, server_urls
from harbor_server.errors import CapacityExceeded
from harbor_server.models import RolloutRequest, RolloutResult, RolloutState, ServerInfo, TaskInfo, TaskPage

__all__ = [
    "LONG_POLL_S",
    "PAGE_SIZE",
    "UNREACHABLE_BACKOFF_S",
    "AsyncHarborClient",
    "AsyncHarborSession",
    "AsyncHarborSessionFactory",
    "HarborClient",
    "HarborSession",
    "HarborSessionFactory",
    "TaskRef",
    "VerifyResult",
    "prompt_row",
    "raise_for_status",
    "server_urls",
    "task_selector",
    "verify_result",
]

T = TypeVar("T")


# -- sync ------------------------------------------------------------------------------------------


class HarborClient(BaseHarborClient):
    """Thin typed wrapper over the REST API (sync)."""

    def __init__(
        self, server_url: str, *, timeout_s: float = 60.0, client: httpx.Client | None = None
    ) -> None:
        super().__init__(server_url, owns_http=client is None)
        self._http = client or httpx.Client(base_url=self.server_url, timeout=timeout_s)

    def _send(self, call: Call[T]) -> T:
        try:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.json, timeout=call.timeout
            )
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        return self._read(call, response)

    def health(self) -> dict[str, Any]:
        return self._send(Endpoints.health())

    def info(self) -> ServerInfo:
        return self._send(Endpoints.info())

    def tasks(self, split: str, *, offset: int = 0, limit: int = PAGE_SIZE) -> TaskPage:
        return self._send(Endpoints.tasks(split, offset, limit))

    def iter_tasks(self, split: str) -> Iterator[TaskInfo]:
        offset: int | None = 0
        while offset is not None:
            page = self.tasks(split, offset=offset)
            yield from page.tasks
            offset = self._next_offset(page, offset)

    def start_rollout(self, request: RolloutRequest) -> RolloutState:
        return self._send(Endpoints.start_rollout(request))

    def rollout(self, rollout_id: str) -> RolloutState:
        return self._send(Endpoints.rollout(rollout_id))

    def rollouts(
        self, *, status: str | None = None, task_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[RolloutState]:
        """Rollouts in the server's store, newest first."""
        return self._send(Endpoints.rollouts(status, task_id, limit, offset))

    def wait(self, rollout_id: str, timeout_s: float = LONG_POLL_S) -> RolloutState:
        return self._send(Endpoints.wait(rollout_id, timeout_s))

    def result(self, rollout_id: str) -> RolloutResult:
        return self._send(Endpoints.result(rollout_id))

    def trace(self, rollout_id: str) -> TrainingTrace:
        return self._send(Endpoints.trace(rollout_id))

    def cancel(self, rollout_id: str) -> RolloutState:
        return self._send(Endpoints.cancel(rollout_id))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()


class HarborSession(BaseHarborSession[HarborClient]):
    """One rollout on the server."""

    def wait_for_completion(self, timeout_s: float | None = None) -> RolloutResult:
        """Block until the rollout is done (or `timeout_s` passes: TimeoutError) and return its result."""
        for wait_s in self._polls(timeout_s, time.monotonic):
            self._seen(self._client.wait(self.rollout_id, wait_s))
        return self._finished()

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None) -> VerifyResult:
        """Waits, then the verifier's verdict. `transcript` and `final_state` are OpenEnv's arguments: the
        reward is born in the sandbox, so they are accepted and not used."""
        return verify_result(self.wait_for_completion())

    def fetch_training_trace(self) -> TrainingTrace:
        """The validated trace; TraceNotTrainable (with the findings) when it cannot be trained on."""
        self.wait_for_completion()
        return self._client.trace(self.rollout_id)

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        """The captured turns as OpenEnv's / TRL's `TraceEntry` records (OpenEnv's LoopOwningSession)."""
        return self.fetch_training_trace().to_trace_entries()

    def cancel(self) -> RolloutState:
        return self._cancelled(self._client.cancel(self.rollout_id))

    def close(self) -> None:
        """Cancel the rollout if it is still running (its sandbox is stopped); a done rollout stays as is."""
        try:
            if self._running:
                self.cancel()
        finally:
            self._release()  # closed: no longer the factory's to count

    def __enter__(self) -> HarborSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HarborSessionFactory(BaseHarborSessionFactory[HarborClient]):
    """Starts rollouts with shared settings: `create(task, seed, episode_id)` -> HarborSession.

    `server_url`: one server, or several sharing a trace store (a list, or one comma-separated
    string); each session goes to the server with the fewest live sessions of this factory.
    """

    _client_class = HarborClient

    def create(self, task: TaskRef, seed: int | None = None, episode_id: str | None = None) -> HarborSession:
        """Start a rollout of `task`: an index, an id, a `prompt_rows()` row, or a TRL prompt (chat
        messages or a string, or a dataset row holding one) naming its task by instruction."""
        return self.start(self.request(task, seed, episode_id))

    def request(
        self, task: TaskRef, seed: int | None = None, episode_id: str | None = None
    ) -> RolloutRequest:
        """The request `create` sends for `task`, to change before `start` (e.g. its metadata)."""
        self._resolve_split()
        task = task_reference(task)
        target = self._tasks().find(task) if is_prompt(task) else task
        return self.config.request(target, seed, episode_id)

    def start(self, request: RolloutRequest) -> HarborSession:
        """Start the rollout `request` on the least busy server, waiting `capacity_wait_s` for a slot."""
        backoff = self._backoff(time.monotonic)
        while True:
            try:
                return self._start_somewhere(request)
            except CapacityExceeded:
                if (delay := backoff.next_delay()) is None:
                    raise
                time.sleep(delay)

    def _start_somewhere(self, request: RolloutRequest) -> HarborSession:
        placement = self._placement()
        for client in placement.servers():
            with placement.attempt():  # a refusal the next server may make up for: on to it
                state = client.start_rollout(request)
                return HarborSession(client, state, on_done=placement.on_done())
        raise placement.none_took()

    def max_live_rollouts(self) -> int:
        """How many rollouts the servers hold live at once, all together (each one's MAX_CONCURRENT_ENVS)."""
        return sum(client.info().capacity.max_concurrent_envs for client in self.clients)

    def prompt_rows(self) -> Iterator[dict[str, Any]]:
        """One row per task offered: `prompt` (chat messages), `task_id`, `task_index`, `split`, `name`."""
        yield from self._tasks().rows()

    def _resolve_split(self) -> None:
        if self.config.split is None:
            self.config.split = self._first_split(self.client.info())

    def _tasks(self) -> TaskCatalog:
        if self._catalog is None:
            self._resolve_split()
            return self._catalog_of(list(self.client.iter_tasks(self.config.split)))
        return self._catalog

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> HarborSessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- async -----------------------------------------------------------------------------------------


class AsyncHarborClient(BaseHarborClient):
    """Thin typed wrapper over the REST API (async)."""

    def __init__(
        self, server_url: str, *, timeout_s: float = 60.0, client: httpx.AsyncClient | None = None
    ) -> None:
        super().__init__(server_url, owns_http=client is None)
        # One event loop may long-poll many rollouts at once, each holding a connection.
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        self._http = client or httpx.AsyncClient(base_url=self.server_url, timeout=timeout_s, limits=limits)

    async def _send(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method, call.path, params=call.params, json=call.json, timeout=call.timeout
            )
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        return self._read(call, response)

    async def health(self) -> dict[str, Any]:
        return await self._send(Endpoints.health())

    async def info(self) -> ServerInfo:
        return await self._send(Endpoints.info())

    async def tasks(self, split: str, *, offset: int = 0, limit: int = PAGE_SIZE) -> TaskPage:
        return await self._send(Endpoints.tasks(split, offset, limit))

    async def iter_tasks(self, split: str) -> AsyncIterator[TaskInfo]:
        offset: int | None = 0
        while offset is not None:
            page = await self.tasks(split, offset=offset)
            for task in page.tasks:
                yield task
            offset = self._next_offset(page, offset)

    async def start_rollout(self, request: RolloutRequest) -> RolloutState:
        return await self._send(Endpoints.start_rollout(request))

    async def rollout(self, rollout_id: str) -> RolloutState:
        return await self._send(Endpoints.rollout(rollout_id))

    async def rollouts(
        self, *, status: str | None = None, task_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[RolloutState]:
        return await self._send(Endpoints.rollouts(status, task_id, limit, offset))

    async def wait(self, rollout_id: str, timeout_s: float = LONG_POLL_S) -> RolloutState:
        return await self._send(Endpoints.wait(rollout_id, timeout_s))

    async def result(self, rollout_id: str) -> RolloutResult:
        return await self._send(Endpoints.result(rollout_id))

    async def trace(self, rollout_id: str) -> TrainingTrace:
        return await self._send(Endpoints.trace(rollout_id))

    async def cancel(self, rollout_id: str) -> RolloutState:
        return await self._send(Endpoints.cancel(rollout_id))

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()


class AsyncHarborSession(BaseHarborSession[AsyncHarborClient]):
    """One rollout on the server (async)."""

    async def wait_for_completion(self, timeout_s: float | None = None) -> RolloutResult:
        for wait_s in self._polls(timeout_s, asyncio.get_running_loop().time):
            self._seen(await self._client.wait(self.rollout_id, wait_s))
        return self._finished()

    async def verify(
        self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None
    ) -> VerifyResult:
        return verify_result(await self.wait_for_completion())

    async def fetch_training_trace(self) -> TrainingTrace:
        await self.wait_for_completion()
        return await self._client.trace(self.rollout_id)

    async def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        return (await self.fetch_training_trace()).to_trace_entries()

    async def cancel(self) -> RolloutState:
        return self._cancelled(await self._client.cancel(self.rollout_id))

    async def close(self) -> None:
        try:
            if self._running:
                await self.cancel()
        finally:
            self._release()

    async def __aenter__(self) -> AsyncHarborSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncHarborSessionFactory(BaseHarborSessionFactory[AsyncHarborClient]):
    """Async twin of HarborSessionFactory: `await create(task, seed, episode_id)` -> AsyncHarborSession."""

    _client_class = AsyncHarborClient

    async def create(
        self, task: TaskRef, seed: int | None = None, episode_id: str | None = None
    ) -> AsyncHarborSession:
        await self._resolve_split()
        task = task_reference(task)
        target = (await self._tasks()).find(task) if is_prompt(task) else task
        request = self.config.request(target, seed, episode_id)
        backoff = self._backoff(asyncio.get_running_loop().time)
        while True:
            try:
                return await self._start_somewhere(request)
            except CapacityExceeded:
                if (delay := backoff.next_delay()) is None:
                    raise
                await asyncio.sleep(delay)

    async def _start_somewhere(self, request: RolloutRequest) -> AsyncHarborSession:
        placement = self._placement()
        for client in placement.servers():
            with placement.attempt():  # a refusal the next server may make up for: on to it
                state = await client.start_rollout(request)
                return AsyncHarborSession(client, state, on_done=placement.on_done())
        raise placement.none_took()

    async def prompt_rows(self) -> AsyncIterator[dict[str, Any]]:
        for row in (await self._tasks()).rows():
            yield row

    async def _resolve_split(self) -> None:
        if self.config.split is None:
            self.config.split = self._first_split(await self.client.info())

    async def _tasks(self) -> TaskCatalog:
        if self._catalog is None:
            await self._resolve_split()
            return self._catalog_of([task async for task in self.client.iter_tasks(self.config.split)])
        return self._catalog

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> AsyncHarborSessionFactory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
