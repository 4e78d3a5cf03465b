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
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
from pydantic import BaseModel, Field, TypeAdapter

from capture_proxy.models import Purpose, SamplingParams, TrainingTrace
from harbor_server.errors import (
    BadRolloutRequest,
    CapacityExceeded,
    HarborServerError,
    RolloutNotFinished,
    RolloutNotFound,
    ServerUnreachable,
    TraceNotTrainable,
)
from harbor_server.models import (
    RolloutRequest,
    RolloutResult,
    RolloutState,
    ServerInfo,
    TaskInfo,
    TaskPage,
)

TaskRef = int | str | Mapping[str, Any]
"""A task index, a task id, or a row from `prompt_rows()` (its task_id is used)."""

_STATES = TypeAdapter(list[RolloutState])

LONG_POLL_S = 30.0
"""Seconds one long-poll request waits on the server before it asks again."""
PAGE_SIZE = 200
UNREACHABLE_BACKOFF_S = 30.0
"""A server that could not be reached is tried after the others for this long."""


class VerifyResult(BaseModel):
    """The environment's verdict. `env_reward` None means unscoreable: never read it as 0."""

    env_reward: float | None
    metrics: dict[str, Any] = Field(default_factory=dict)


def verify_result(result: RolloutResult) -> VerifyResult:
    metrics: dict[str, Any] = {
        "status": result.status,
        "rewards": dict(result.rewards),
        "timed_out": result.timed_out,
        "tool_call_count": result.tool_call_count,
        "tool_failure_count": result.tool_failures,
        "tool_calls_by_name": dict(result.tool_calls_by_name),
        "num_turns": result.num_turns,
        "timings": dict(result.timings),
        "error": result.error,
    }
    return VerifyResult(env_reward=result.env_reward, metrics=metrics)


def task_selector(task: TaskRef) -> dict[str, Any]:
    """`task_index` or `task_id` for a rollout request, from whatever the caller holds."""
    if isinstance(task, bool):
        raise TypeError("a task is an index, an id or a prompt row, not a bool")
    if isinstance(task, int):
        return {"task_index": task}
    if isinstance(task, str):
        return {"task_id": task}
    if isinstance(task, Mapping):
        if task.get("task_id"):
            return {"task_id": str(task["task_id"])}
        if task.get("task_index") is not None:
            return {"task_index": int(task["task_index"])}
        raise ValueError(f"a task row needs task_id or task_index; got keys {sorted(task)}")
    raise TypeError(f"cannot make a task reference of {type(task).__name__}")


def prompt_row(task: TaskInfo) -> dict[str, Any]:
    """A dataset row for the trainer: the instruction as a chat prompt, plus how to find the task again."""
    return {
        "prompt": [{"role": "user", "content": task.instruction}],
        "task_id": task.task_id,
        "task_index": task.index,
        "split": task.split,
        "name": task.name,
    }


def raise_for_status(response: httpx.Response) -> None:
    """Turn a 4xx/5xx answer into the server's own error class, keeping its message."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    detail = body.get("detail") if isinstance(body, dict) else body
    message = detail if isinstance(detail, str) else str(detail)
    where = f"{response.request.method} {response.request.url.path}"
    code = response.status_code
    if code == 409 and isinstance(body, dict) and body.get("findings") is not None:
        raise TraceNotTrainable(f"{where}: {message}", body["findings"])
    if code == 409:
        raise RolloutNotFinished(f"{where}: {message}")
    if code == 429:
        raise CapacityExceeded(f"{where}: {message}")
    if code == 404 and "/rollouts/" in response.request.url.path:
        error = RolloutNotFound(response.request.url.path.split("/")[2])
        error.message = f"{where}: {message}"
        raise error
    if 400 <= code < 500:
        raise BadRolloutRequest(f"{where}: {message}", status=code, detail=detail)
    raise HarborServerError(f"{where}: server error {code}: {message}", status=code, detail=detail)


def _listing(status: str | None, task_id: str | None, limit: int, offset: int) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    if status is not None:
        params["status"] = status
    if task_id is not None:
        params["task_id"] = task_id
    return params


def _rollout_path(rollout_id: str, tail: str = "") -> str:
    return f"/rollouts/{rollout_id}{tail}"


class _FactoryConfig:
    """What every rollout a factory starts has in common."""

    def __init__(
        self,
        *,
        split: str,
        harness: str,
        sandbox: str | None,
        llm_url: str | None,
        model: str | None,
        sampling: SamplingParams | Mapping[str, Any] | None,
        agent_timeout_sec: float | None,
        agent_step_limit: int,
        purpose: Purpose,
        metadata: Mapping[str, Any] | None,
    ) -> None:
        self.split = split
        self.harness = harness
        self.sandbox = sandbox
        self.llm_url = llm_url
        self.model = model
        if sampling is None:
            sampling = SamplingParams()
        elif not isinstance(sampling, SamplingParams):
            sampling = SamplingParams.model_validate(dict(sampling))
        self.sampling = sampling
        self.agent_timeout_sec = agent_timeout_sec
        self.agent_step_limit = agent_step_limit
        self.purpose = purpose
        self.metadata = dict(metadata or {})

    def request(self, task: TaskRef, seed: int | None, episode_id: str | None) -> RolloutRequest:
        sampling = (
            self.sampling
            if seed is None or self.sampling.seed is not None
            else self.sampling.model_copy(update={"seed": seed})
        )
        return RolloutRequest(
            split=self.split,
            harness=self.harness,
            sandbox=self.sandbox,
            llm_url=self.llm_url,
            model=self.model,
            sampling=sampling,
            agent_timeout_sec=self.agent_timeout_sec,
            agent_step_limit=self.agent_step_limit,
            purpose=self.purpose,
            seed=seed,
            episode_id=episode_id,
            metadata=self.metadata,
            **task_selector(task),
        )


# -- sync ------------------------------------------------------------------------------------------


def server_urls(server_url: str | Sequence[str]) -> list[str]:
    """One URL, a comma-separated string of them, or a sequence -> the URLs, in order."""
    items = [server_url] if isinstance(server_url, str) else list(server_url)
    urls = [url.strip().rstrip("/") for item in items for url in str(item).split(",") if url.strip()]
    if not urls:
        raise ValueError(f"no harbor server URL given (got {server_url!r})")
    repeated = sorted({url for url in urls if urls.count(url) > 1})
    if repeated:
        raise ValueError(f"harbor server URL(s) given more than once: {', '.join(repeated)}")
    return urls


class _Spread:
    """Which server the next session goes to: the fewest live sessions of this factory, round-robin
    among ties, a server found unreachable lately after all others. Thread-safe (trainers create
    sessions from a pool of threads); a server's count goes up when it is picked, so a burst of
    concurrent creates spreads too."""

    def __init__(self, n: int) -> None:
        self._live = [0] * n
        self._down_until = [0.0] * n
        self._next = 0
        self._lock = threading.Lock()

    def take(self, tried: set[int]) -> int | None:
        """Pick a server not in `tried` and count a session on it; None when all were tried."""
        with self._lock:
            n, now = len(self._live), time.monotonic()
            left = [i for i in range(n) if i not in tried]
            if not left:
                return None
            i = min(left, key=lambda j: (self._down_until[j] > now, self._live[j], (j - self._next) % n))
            self._live[i] += 1
            self._next = (i + 1) % n
            return i

    def release(self, i: int) -> None:
        with self._lock:
            self._live[i] -= 1

    def unreachable(self, i: int) -> None:
        with self._lock:
            self._down_until[i] = time.monotonic() + UNREACHABLE_BACKOFF_S

    def snapshot(self) -> list[int]:
        with self._lock:
            return list(self._live)


_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport failures before the request left: another server may take it without risking a duplicate
rollout (after a read timeout the first server may have started it)."""


def _try_next(exc: BaseException, spread: _Spread, i: int) -> bool:
    """Whether a refused start may go to the next server: at capacity, or never reached."""
    if isinstance(exc, CapacityExceeded):
        return True
    if isinstance(exc, ServerUnreachable) and isinstance(exc.__cause__, _NEVER_SENT):
        spread.unreachable(i)
        return True
    return False


def _none_took(refusals: list[tuple[str, HarborServerError]]) -> HarborServerError:
    """The error when no server took the rollout: a single server's own, else one naming each server.
    CapacityExceeded if any server was only full (retrying may help), else ServerUnreachable."""
    if len(refusals) == 1:
        return refusals[0][1]
    reasons = "; ".join(f"{url}: {exc.message}" for url, exc in refusals)
    full = any(isinstance(exc, CapacityExceeded) for _, exc in refusals)
    kind = CapacityExceeded if full else ServerUnreachable
    return kind(f"none of the {len(refusals)} harbor servers took the rollout: {reasons}")


class HarborClient:
    """Thin typed wrapper over the REST API (sync)."""

    def __init__(
        self, server_url: str, *, timeout_s: float = 60.0, client: httpx.Client | None = None
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self._owns_client = client is None
        self._http = client or httpx.Client(base_url=self.server_url, timeout=timeout_s)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"harbor server at {self.server_url} is unreachable: {exc}") from exc
        raise_for_status(response)
        return response

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health").json()

    def info(self) -> ServerInfo:
        return ServerInfo.model_validate_json(self._call("GET", "/info").content)

    def tasks(self, split: str, *, offset: int = 0, limit: int = PAGE_SIZE) -> TaskPage:
        params = {"split": split, "offset": offset, "limit": limit}
        return TaskPage.model_validate_json(self._call("GET", "/tasks", params=params).content)

    def iter_tasks(self, split: str) -> Iterator[TaskInfo]:
        offset = 0
        while True:
            page = self.tasks(split, offset=offset)
            yield from page.tasks
            offset += len(page.tasks)
            if not page.tasks or offset >= page.total:
                return

    def start_rollout(self, request: RolloutRequest) -> RolloutState:
        body = request.model_dump(mode="json")
        return RolloutState.model_validate_json(self._call("POST", "/rollouts", json=body).content)

    def rollout(self, rollout_id: str) -> RolloutState:
        return RolloutState.model_validate_json(self._call("GET", _rollout_path(rollout_id)).content)

    def rollouts(
        self, *, status: str | None = None, task_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[RolloutState]:
        """Rollouts in the server's store, newest first."""
        params = _listing(status, task_id, limit, offset)
        return _STATES.validate_json(self._call("GET", "/rollouts", params=params).content)

    def wait(self, rollout_id: str, timeout_s: float = LONG_POLL_S) -> RolloutState:
        params = {"timeout": timeout_s}
        response = self._call(
            "GET", _rollout_path(rollout_id, "/wait"), params=params, timeout=timeout_s + 30
        )
        return RolloutState.model_validate_json(response.content)

    def result(self, rollout_id: str) -> RolloutResult:
        return RolloutResult.model_validate_json(
            self._call("GET", _rollout_path(rollout_id, "/result")).content
        )

    def trace(self, rollout_id: str) -> TrainingTrace:
        return TrainingTrace.model_validate_json(
            self._call("GET", _rollout_path(rollout_id, "/trace")).content
        )

    def cancel(self, rollout_id: str) -> RolloutState:
        return RolloutState.model_validate_json(
            self._call("POST", _rollout_path(rollout_id, "/cancel")).content
        )

    def close(self) -> None:
        if self._owns_client:
            self._http.close()


class _Counted:
    """A session that tells its factory, once, when its rollout is over or it is closed: the factory
    sends new sessions to the server with the fewest live ones."""

    _on_done: Callable[[], None] | None
    _result: RolloutResult | None
    state: RolloutState

    def _release(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def _note_if_done(self) -> None:
        if self._result is not None or self.state.done:
            self._release()


class HarborSession(_Counted):
    """One rollout on the server."""

    def __init__(
        self, client: HarborClient, state: RolloutState, *, on_done: Callable[[], None] | None = None
    ) -> None:
        self._client = client
        self.state = state
        self._result: RolloutResult | None = state.result
        self._on_done = on_done
        self._note_if_done()

    @property
    def server_url(self) -> str:
        """The server running this rollout."""
        return self._client.server_url

    @property
    def rollout_id(self) -> str:
        return self.state.rollout_id

    def wait_for_completion(self, timeout_s: float | None = None) -> RolloutResult:
        """Block until the rollout is done (or `timeout_s` passes: TimeoutError) and return its result."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._result is None:
            remaining = LONG_POLL_S if deadline is None else min(LONG_POLL_S, deadline - time.monotonic())
            if remaining <= 0:
                raise TimeoutError(f"rollout {self.rollout_id} still {self.state.phase} after {timeout_s} s")
            self.state = self._client.wait(self.rollout_id, remaining)
            self._result = self.state.result
        self._note_if_done()
        return self._result

    def verify(self) -> VerifyResult:
        return verify_result(self.wait_for_completion())

    def fetch_training_trace(self) -> TrainingTrace:
        """The validated trace; TraceNotTrainable (with the findings) when it cannot be trained on."""
        self.wait_for_completion()
        return self._client.trace(self.rollout_id)

    def cancel(self) -> RolloutState:
        self.state = self._client.cancel(self.rollout_id)
        self._result = self.state.result
        self._note_if_done()
        return self.state

    def close(self) -> None:
        """Cancel the rollout if it is still running (its sandbox is stopped); a done rollout stays as is."""
        try:
            if self._result is None and not self.state.done:
                self.cancel()
        finally:
            self._release()  # closed: no longer the factory's to count

    def __enter__(self) -> HarborSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HarborSessionFactory:
    """Starts rollouts with shared settings: `create(task, seed, episode_id)` -> HarborSession.

    `server_url`: one server, or several sharing a trace store (a list, or one comma-separated
    string); each session goes to the server with the fewest live sessions of this factory.
    """

    def __init__(
        self,
        server_url: str | Sequence[str],
        *,
        split: str,
        harness: str,
        sandbox: str | None = None,
        llm_url: str | None = None,
        model: str | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        agent_timeout_sec: float | None = 600,
        agent_step_limit: int = 0,
        purpose: Purpose = "train",
        metadata: Mapping[str, Any] | None = None,
        capacity_wait_s: float = 0.0,
        timeout_s: float = 60.0,
    ) -> None:
        self.config = _FactoryConfig(
            split=split,
            harness=harness,
            sandbox=sandbox,
            llm_url=llm_url,
            model=model,
            sampling=sampling,
            agent_timeout_sec=agent_timeout_sec,
            agent_step_limit=agent_step_limit,
            purpose=purpose,
            metadata=metadata,
        )
        self.capacity_wait_s = capacity_wait_s
        """Seconds `create` keeps retrying while every server answers 429 (0: fail at once)."""
        self.clients = [HarborClient(url, timeout_s=timeout_s) for url in server_urls(server_url)]
        self.client = self.clients[0]
        """The first server's client; it lists the tasks (every server is expected to serve the split)."""
        self._spread = _Spread(len(self.clients))

    @property
    def live_sessions(self) -> dict[str, int]:
        """Sessions of this factory not yet known to be over, per server URL."""
        return dict(zip((c.server_url for c in self.clients), self._spread.snapshot(), strict=True))

    def create(self, task: TaskRef, seed: int | None = None, episode_id: str | None = None) -> HarborSession:
        request = self.config.request(task, seed, episode_id)
        deadline = time.monotonic() + self.capacity_wait_s
        delay = 0.2
        while True:
            try:
                return self._start_somewhere(request)
            except CapacityExceeded:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _start_somewhere(self, request: RolloutRequest) -> HarborSession:
        refusals: list[tuple[str, HarborServerError]] = []
        tried: set[int] = set()
        while (i := self._spread.take(tried)) is not None:
            tried.add(i)
            client = self.clients[i]
            try:
                state = client.start_rollout(request)
            except BaseException as exc:
                self._spread.release(i)
                if not _try_next(exc, self._spread, i):
                    raise
                refusals.append((client.server_url, exc))
                continue
            return HarborSession(client, state, on_done=functools.partial(self._spread.release, i))
        raise _none_took(refusals)

    def prompt_rows(self) -> Iterator[dict[str, Any]]:
        """One row per task of the split: `prompt` (chat messages), `task_id`, `task_index`, `split`, `name`."""
        for task in self.client.iter_tasks(self.config.split):
            yield prompt_row(task)

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> HarborSessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- async -----------------------------------------------------------------------------------------


class AsyncHarborClient:
    """Thin typed wrapper over the REST API (async)."""

    def __init__(
        self, server_url: str, *, timeout_s: float = 60.0, client: httpx.AsyncClient | None = None
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self._owns_client = client is None
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        self._http = client or httpx.AsyncClient(base_url=self.server_url, timeout=timeout_s, limits=limits)

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"harbor server at {self.server_url} is unreachable: {exc}") from exc
        raise_for_status(response)
        return response

    async def health(self) -> dict[str, Any]:
        return (await self._call("GET", "/health")).json()

    async def info(self) -> ServerInfo:
        return ServerInfo.model_validate_json((await self._call("GET", "/info")).content)

    async def tasks(self, split: str, *, offset: int = 0, limit: int = PAGE_SIZE) -> TaskPage:
        params = {"split": split, "offset": offset, "limit": limit}
        return TaskPage.model_validate_json((await self._call("GET", "/tasks", params=params)).content)

    async def iter_tasks(self, split: str) -> AsyncIterator[TaskInfo]:
        offset = 0
        while True:
            page = await self.tasks(split, offset=offset)
            for task in page.tasks:
                yield task
            offset += len(page.tasks)
            if not page.tasks or offset >= page.total:
                return

    async def start_rollout(self, request: RolloutRequest) -> RolloutState:
        body = request.model_dump(mode="json")
        return RolloutState.model_validate_json((await self._call("POST", "/rollouts", json=body)).content)

    async def rollout(self, rollout_id: str) -> RolloutState:
        return RolloutState.model_validate_json((await self._call("GET", _rollout_path(rollout_id))).content)

    async def rollouts(
        self, *, status: str | None = None, task_id: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[RolloutState]:
        params = _listing(status, task_id, limit, offset)
        return _STATES.validate_json((await self._call("GET", "/rollouts", params=params)).content)

    async def wait(self, rollout_id: str, timeout_s: float = LONG_POLL_S) -> RolloutState:
        params = {"timeout": timeout_s}
        response = await self._call(
            "GET", _rollout_path(rollout_id, "/wait"), params=params, timeout=timeout_s + 30
        )
        return RolloutState.model_validate_json(response.content)

    async def result(self, rollout_id: str) -> RolloutResult:
        response = await self._call("GET", _rollout_path(rollout_id, "/result"))
        return RolloutResult.model_validate_json(response.content)

    async def trace(self, rollout_id: str) -> TrainingTrace:
        response = await self._call("GET", _rollout_path(rollout_id, "/trace"))
        return TrainingTrace.model_validate_json(response.content)

    async def cancel(self, rollout_id: str) -> RolloutState:
        response = await self._call("POST", _rollout_path(rollout_id, "/cancel"))
        return RolloutState.model_validate_json(response.content)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()


class AsyncHarborSession(_Counted):
    """One rollout on the server (async)."""

    def __init__(
        self, client: AsyncHarborClient, state: RolloutState, *, on_done: Callable[[], None] | None = None
    ) -> None:
        self._client = client
        self.state = state
        self._result: RolloutResult | None = state.result
        self._on_done = on_done
        self._note_if_done()

    @property
    def server_url(self) -> str:
        return self._client.server_url

    @property
    def rollout_id(self) -> str:
        return self.state.rollout_id

    async def wait_for_completion(self, timeout_s: float | None = None) -> RolloutResult:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while self._result is None:
            remaining = LONG_POLL_S if deadline is None else min(LONG_POLL_S, deadline - loop.time())
            if remaining <= 0:
                raise TimeoutError(f"rollout {self.rollout_id} still {self.state.phase} after {timeout_s} s")
            self.state = await self._client.wait(self.rollout_id, remaining)
            self._result = self.state.result
        self._note_if_done()
        return self._result

    async def verify(self) -> VerifyResult:
        return verify_result(await self.wait_for_completion())

    async def fetch_training_trace(self) -> TrainingTrace:
        await self.wait_for_completion()
        return await self._client.trace(self.rollout_id)

    async def cancel(self) -> RolloutState:
        self.state = await self._client.cancel(self.rollout_id)
        self._result = self.state.result
        self._note_if_done()
        return self.state

    async def close(self) -> None:
        try:
            if self._result is None and not self.state.done:
                await self.cancel()
        finally:
            self._release()

    async def __aenter__(self) -> AsyncHarborSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncHarborSessionFactory:
    """Async twin of HarborSessionFactory: `await create(task, seed, episode_id)` -> AsyncHarborSession."""

    def __init__(
        self,
        server_url: str | Sequence[str],
        *,
        split: str,
        harness: str,
        sandbox: str | None = None,
        llm_url: str | None = None,
        model: str | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        agent_timeout_sec: float | None = 600,
        agent_step_limit: int = 0,
        purpose: Purpose = "train",
        metadata: Mapping[str, Any] | None = None,
        capacity_wait_s: float = 0.0,
        timeout_s: float = 60.0,
    ) -> None:
        self.config = _FactoryConfig(
            split=split,
            harness=harness,
            sandbox=sandbox,
            llm_url=llm_url,
            model=model,
            sampling=sampling,
            agent_timeout_sec=agent_timeout_sec,
            agent_step_limit=agent_step_limit,
            purpose=purpose,
            metadata=metadata,
        )
        self.capacity_wait_s = capacity_wait_s
        self.clients = [AsyncHarborClient(url, timeout_s=timeout_s) for url in server_urls(server_url)]
        self.client = self.clients[0]
        self._spread = _Spread(len(self.clients))

    @property
    def live_sessions(self) -> dict[str, int]:
        return dict(zip((c.server_url for c in self.clients), self._spread.snapshot(), strict=True))

    async def create(
        self, task: TaskRef, seed: int | None = None, episode_id: str | None = None
    ) -> AsyncHarborSession:
        request = self.config.request(task, seed, episode_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.capacity_wait_s
        delay = 0.2
        while True:
            try:
                return await self._start_somewhere(request)
            except CapacityExceeded:
                if loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _start_somewhere(self, request: RolloutRequest) -> AsyncHarborSession:
        refusals: list[tuple[str, HarborServerError]] = []
        tried: set[int] = set()
        while (i := self._spread.take(tried)) is not None:
            tried.add(i)
            client = self.clients[i]
            try:
                state = await client.start_rollout(request)
            except BaseException as exc:
                self._spread.release(i)
                if not _try_next(exc, self._spread, i):
                    raise
                refusals.append((client.server_url, exc))
                continue
            return AsyncHarborSession(client, state, on_done=functools.partial(self._spread.release, i))
        raise _none_took(refusals)

    async def prompt_rows(self) -> AsyncIterator[dict[str, Any]]:
        async for task in self.client.iter_tasks(self.config.split):
            yield prompt_row(task)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    async def __aenter__(self) -> AsyncHarborSessionFactory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
