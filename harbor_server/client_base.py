"""What the sync and async clients of `harbor serve` share: everything but the sending.

`harbor_server.client` builds its twins (`HarborClient`/`AsyncHarborClient`, ...) on the three base
classes here, the way httpx builds `Client`/`AsyncClient` on `BaseClient`. A base holds the settings,
the requests as data (`Endpoints`), the reading of answers into models or `harbor_server.errors`
exceptions, the paging and the session state (the spreading over several servers is in
`harbor_server.client_spread`); a twin only sends (`httpx.Client` or `httpx.AsyncClient`) and
sleeps. A change of behaviour is made here once; a change of a public signature in both twins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, Field, TypeAdapter

from capture_proxy.models import Purpose, SamplingParams, TrainingTrace
from harbor_server.client_spread import CapacityBackoff, Placement, Spread, server_urls
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

TaskRef = int | str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""A task index, a task id, a row from `prompt_rows()` (its task_id is used), a TRL prompt (the row's
chat messages or one string, which name their task by its instruction), or a TRL dataset row that names
no task (its `prompt` is used)."""

_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What a task id looks like (tasks.datasets): a string of this shape is an id, any other a prompt."""

LONG_POLL_S = 30.0
"""Seconds one long-poll request waits on the server before it asks again."""
PAGE_SIZE = 200

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class VerifyResult(BaseModel):
    """The environment's verdict, shaped as OpenEnv's (`openenv/core/harness/rollout.py`). `env_reward`
    None means unscoreable: never read it as 0."""

    env_reward: float | None
    done: bool = True
    """The rollout is over (always, once the server has a result)."""
    metrics: dict[str, Any] = Field(default_factory=dict)
    artifacts: dict[str, Any] = Field(default_factory=dict)


def verify_result(result: RolloutResult) -> VerifyResult:
    metrics: dict[str, Any] = {
        "status": result.status,
        "rewards": dict(result.rewards),
        "timed_out": result.timed_out,
        "tool_call_count": result.tool_call_count,
        "tool_failure_count": result.tool_failures,
        "tool_calls_by_name": dict(result.tool_calls_by_name),
        "tool_failures_by_name": dict(result.tool_failures_by_name),
        "num_turns": result.num_turns,
        "timings": dict(result.timings),
        "error": result.error,
    }
    return VerifyResult(env_reward=result.env_reward, metrics=metrics)


def task_reference(task: TaskRef) -> TaskRef:
    """What names the task: a dataset row with no task_id or task_index but a `prompt` (a TRL dataset's
    row, whatever its other columns) is its prompt; anything else names it itself."""
    names_a_task = isinstance(task, Mapping) and (task.get("task_id") or task.get("task_index") is not None)
    if isinstance(task, Mapping) and not names_a_task and "prompt" in task:
        return task["prompt"]
    return task


def is_prompt(task: TaskRef) -> bool:
    """A TRL prompt (chat messages, or a string that is not a task id) rather than a task reference."""
    if isinstance(task, str):
        return _TASK_ID.fullmatch(task) is None
    return isinstance(task, Sequence) and not isinstance(task, Mapping)


def prompt_instruction(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """The instruction a prompt carries: the string itself, or its last user message's text."""
    if isinstance(prompt, str):
        return prompt.strip()
    for message in reversed(prompt):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI's content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            return str(content or "").strip()
    raise ValueError("a chat prompt needs a user message carrying the task's instruction")


def _check_reward_key(tasks: Sequence[TaskInfo], reward_key: str | None, split: str | None) -> None:
    """Refuse, once and before any rollout, tasks whose verifier never reports the key that trains."""
    key = reward_key or "reward"
    lacking = [t for t in tasks if t.reward_keys is not None and key not in t.reward_keys]
    if not lacking:
        return
    names = ", ".join(f"{t.task_id} ({', '.join(t.reward_keys or []) or 'none'})" for t in lacking[:5])
    more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
    hint = "set reward_key to one of the metrics they report" if reward_key is None else "choose another reward_key"
    raise BadRolloutRequest(
        f"reward_key {key!r}: {len(lacking)} task(s) of split {split!r} never report it: {names}{more}; {hint}"
    )


class TaskCatalog:
    """The tasks a factory offers: its split, cut to `indices` or the first `num_tasks` (as OpenEnv's
    HarborSessionFactory, `envs/harbor_env/harness.py`), found again by the instruction a prompt carries."""

    def __init__(self, tasks: Sequence[TaskInfo], *, num_tasks: int | None, indices: Sequence[int] | None):
        tasks = list(tasks)
        if indices is not None:
            bad = [i for i in indices if not 0 <= i < len(tasks)]
            if bad:
                raise ValueError(f"indices {bad[:5]} are out of range: the split has {len(tasks)} tasks")
            tasks = [tasks[i] for i in indices]
        elif num_tasks is not None:
            tasks = tasks[:num_tasks]
        self.tasks = tasks
        self._by_instruction: dict[str, list[TaskInfo]] = {}
        for task in tasks:
            self._by_instruction.setdefault(task.instruction.strip(), []).append(task)

    def rows(self) -> list[dict[str, Any]]:
        return [prompt_row(task) for task in self.tasks]

    def find(self, prompt: str | Sequence[Mapping[str, Any]]) -> TaskInfo:
        """The one task whose instruction the prompt carries; ValueError naming the prompt otherwise."""
        instruction = prompt_instruction(prompt)
        matches = self._by_instruction.get(instruction, [])
        if len(matches) == 1:
            return matches[0]
        words = " ".join(instruction.split()[:8])
        if not matches:
            raise ValueError(
                f"the prompt {words!r}... is the instruction of none of the {len(self.tasks)} tasks offered; "
                "build the dataset from factory.prompt_rows() so each prompt is a task's instruction"
            )
        ids = ", ".join(t.task_id for t in matches)
        raise ValueError(
            f"the prompt {words!r}... is the instruction of {len(matches)} tasks ({ids}); pass a task id"
        )


def task_selector(task: TaskRef) -> dict[str, Any]:
    """`task_index` or `task_id` for a rollout request, from a task reference (not a prompt)."""
    if isinstance(task, bool):
        raise TypeError("a task is an index, an id, a prompt row or a prompt, not a bool")
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


# -- the REST API as data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the REST API and how its (successful) answer is read; a twin's `_send` sends it."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    timeout: Any = httpx.USE_CLIENT_DEFAULT  # the client's own timeout, unless a call needs longer


def _as(model: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: model.model_validate_json(response.content)


_STATES = TypeAdapter(list[RolloutState])


class Endpoints:
    """Every call the clients make, built once for both twins."""

    @staticmethod
    def health() -> Call[dict[str, Any]]:
        return Call("GET", "/health", lambda response: response.json())

    @staticmethod
    def info() -> Call[ServerInfo]:
        return Call("GET", "/info", _as(ServerInfo))

    @staticmethod
    def tasks(split: str, offset: int, limit: int) -> Call[TaskPage]:
        params = {"split": split, "offset": offset, "limit": limit}
        return Call("GET", "/tasks", _as(TaskPage), params=params)

    @staticmethod
    def start_rollout(request: RolloutRequest) -> Call[RolloutState]:
        body = request.model_dump(mode="json")
        # Only the sampling fields the caller set: an eval session applies exactly those over the agent's.
        body["sampling"] = request.sampling.model_dump(mode="json", exclude_unset=True)
        return Call("POST", "/rollouts", _as(RolloutState), json=body)

    @staticmethod
    def rollout(rollout_id: str) -> Call[RolloutState]:
        return Call("GET", _rollout_path(rollout_id), _as(RolloutState))

    @staticmethod
    def rollouts(
        status: str | None, task_id: str | None, limit: int, offset: int
    ) -> Call[list[RolloutState]]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status is not None:
            params["status"] = status
        if task_id is not None:
            params["task_id"] = task_id
        return Call(
            "GET", "/rollouts", lambda response: _STATES.validate_json(response.content), params=params
        )

    @staticmethod
    def wait(rollout_id: str, timeout_s: float) -> Call[RolloutState]:
        # The HTTP read outlasts the server's long poll, so a slow answer is not taken for a dead server.
        path, params = _rollout_path(rollout_id, "/wait"), {"timeout": timeout_s}
        return Call("GET", path, _as(RolloutState), params=params, timeout=timeout_s + 30)

    @staticmethod
    def result(rollout_id: str) -> Call[RolloutResult]:
        return Call("GET", _rollout_path(rollout_id, "/result"), _as(RolloutResult))

    @staticmethod
    def trace(rollout_id: str) -> Call[TrainingTrace]:
        return Call("GET", _rollout_path(rollout_id, "/trace"), _as(TrainingTrace))

    @staticmethod
    def cancel(rollout_id: str) -> Call[RolloutState]:
        return Call("POST", _rollout_path(rollout_id, "/cancel"), _as(RolloutState))


def _rollout_path(rollout_id: str, tail: str = "") -> str:
    return f"/rollouts/{rollout_id}{tail}"


class BaseHarborClient:
    """One server's URL, and what its twins do around sending: the transport failure as
    ServerUnreachable, an error answer as the server's own exception, an answer as its model."""

    def __init__(self, server_url: str, *, owns_http: bool) -> None:
        self.server_url = server_url.rstrip("/")
        self._owns_http = owns_http

    def _unreachable(self, exc: httpx.TransportError) -> ServerUnreachable:
        return ServerUnreachable(f"harbor server at {self.server_url} is unreachable: {exc}")

    @staticmethod
    def _read(call: Call[T], response: httpx.Response) -> T:
        raise_for_status(response)
        return call.read(response)

    @staticmethod
    def _next_offset(page: TaskPage, offset: int) -> int | None:
        """Where the page after `page` (which started at `offset`) starts; None after the last."""
        offset += len(page.tasks)
        return None if not page.tasks or offset >= page.total else offset


ClientT = TypeVar("ClientT", bound=BaseHarborClient)


# -- sessions --------------------------------------------------------------------------------------


class BaseHarborSession(Generic[ClientT]):
    """One rollout's state as last seen, and its place in the factory's count: it tells the factory,
    once, when the rollout is over or the session closed, so new sessions go where fewest are live."""

    def __init__(
        self, client: ClientT, state: RolloutState, *, on_done: Callable[[], None] | None = None
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

    def _seen(self, state: RolloutState) -> None:
        self.state = state
        self._result = state.result

    def _cancelled(self, state: RolloutState) -> RolloutState:
        self._seen(state)
        self._note_if_done()
        return self.state

    @property
    def _running(self) -> bool:
        return self._result is None and not self.state.done

    def _polls(self, timeout_s: float | None, clock: Callable[[], float]) -> Iterator[float]:
        """How long each long poll waits, until the result is in: LONG_POLL_S, the last cut short to
        end at `timeout_s` (TimeoutError once it has passed)."""
        deadline = None if timeout_s is None else clock() + timeout_s
        while self._result is None:
            remaining = LONG_POLL_S if deadline is None else min(LONG_POLL_S, deadline - clock())
            if remaining <= 0:
                raise TimeoutError(f"rollout {self.rollout_id} still {self.state.phase} after {timeout_s} s")
            yield remaining

    def _finished(self) -> RolloutResult:
        """The result, once the polls have brought it."""
        assert self._result is not None
        self._note_if_done()
        return self._result

    def _release(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def _note_if_done(self) -> None:
        if self._result is not None or self.state.done:
            self._release()


# -- factories -------------------------------------------------------------------------------------


class _FactoryConfig:
    """What every rollout a factory starts has in common."""

    def __init__(
        self,
        *,
        split: str | None,
        harness: str,
        sandbox: str | None,
        llm_url: str | None,
        model: str | None,
        sampling: SamplingParams | Mapping[str, Any] | None,
        agent_timeout_sec: float | None,
        agent_step_limit: int,
        purpose: Purpose,
        metadata: Mapping[str, Any] | None,
        reward_key: str | None = None,
        api_key: str | None = None,
        auth_header: str | None = None,
    ) -> None:
        self.split = split or None
        """None until the server's first split is looked up (OpenEnv's default)."""
        self.harness = harness
        self.sandbox = sandbox
        self.llm_url = llm_url or None
        self.model = model or None
        if sampling is None:
            sampling = SamplingParams()
        elif not isinstance(sampling, SamplingParams):
            sampling = SamplingParams.model_validate(dict(sampling))
        if purpose == "train":
            sampling.require_neutral()  # here, not at the first rollout: a bad policy fails the trainer's set-up
        self.sampling = sampling
        self.agent_timeout_sec = agent_timeout_sec or None  # OpenEnv's 0: the task's own timeout
        self.agent_step_limit = agent_step_limit
        self.purpose = purpose
        self.metadata = dict(metadata or {})
        self.reward_key = reward_key or None
        self.api_key = api_key or None
        self.auth_header = auth_header or None

    def request(self, task: TaskRef | TaskInfo, seed: int | None, episode_id: str | None) -> RolloutRequest:
        """The rollout request for `task`. With a task reference `seed` also seeds the sampler (so an
        evaluation replays); a task found from a prompt (TaskInfo) came the TRL/OpenEnv way, where every
        member of a group passes the group's id as `seed`: there it only labels the rollout, or the
        group's members would all sample alike."""
        if isinstance(task, TaskInfo):
            selector, seeds_sampler = {"task_id": task.task_id}, False
        else:
            selector, seeds_sampler = task_selector(task), True
        sampling = (
            self.sampling
            if seed is None or not seeds_sampler or self.sampling.seed is not None
            else self.sampling.model_copy(update={"seed": seed})
        )
        if self.split is None:
            raise RuntimeError("the factory's split is not resolved yet")  # the twins resolve it first
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
            reward_key=self.reward_key,
            api_key=self.api_key,
            auth_header=self.auth_header,
            seed=seed,
            episode_id=episode_id,
            metadata=self.metadata,
            **selector,
        )


class BaseHarborSessionFactory(Generic[ClientT]):
    """The settings every rollout of a factory shares, one client per server, and the count of live
    sessions per server that picks where the next one goes."""

    _client_class: type[ClientT]
    """The twin's client, one per server."""

    def __init__(
        self,
        server_url: str | Sequence[str],
        *,
        split: str | None = None,
        harness: str = "opencode",
        sandbox: str | None = None,
        llm_url: str | None = None,
        model: str | None = None,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        agent_timeout_sec: float | None = 600,
        agent_step_limit: int = 0,
        reward_key: str | None = None,
        api_key: str | None = None,
        auth_header: str | None = None,
        num_tasks: int | None = None,
        indices: Sequence[int] | None = None,
        purpose: Purpose = "train",
        metadata: Mapping[str, Any] | None = None,
        capacity_wait_s: float = 0.0,
        timeout_s: float = 60.0,
    ) -> None:
        """The keywords OpenEnv's HarborSessionFactory takes (`envs/harbor_env/harness.py`) mean what they
        mean there: `split` None is the server's first, `reward_key` picks the verifier's reward key,
        `api_key` / `auth_header` are the engine's credential, `num_tasks` / `indices` cut the tasks that
        `prompt_rows()` offers and prompts are found among. `sandbox` None is the server's --sandbox."""
        if indices is not None and not list(indices):
            raise ValueError("indices is empty: no task would be offered (pass None for the whole split)")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(
                f"num_tasks={num_tasks}: offer at least one task (pass None for the whole split)"
            )
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
            reward_key=reward_key,
            api_key=api_key,
            auth_header=auth_header,
        )
        self.num_tasks = num_tasks
        self.indices = list(indices) if indices is not None else None
        self.capacity_wait_s = capacity_wait_s
        """Seconds `create` keeps retrying while every server answers 429 (0: fail at once)."""
        self.clients = [self._client_class(url, timeout_s=timeout_s) for url in server_urls(server_url)]
        self.client = self.clients[0]
        """The first server's client; it lists the tasks (every server is expected to serve the split)."""
        self._spread = Spread(len(self.clients))
        self._catalog: TaskCatalog | None = None

    def _catalog_of(self, tasks: Sequence[TaskInfo]) -> TaskCatalog:
        catalog = TaskCatalog(tasks, num_tasks=self.num_tasks, indices=self.indices)
        if self.config.purpose == "train":  # an evaluation reports every metric; training needs one
            _check_reward_key(catalog.tasks, self.config.reward_key, self.config.split)
        self._catalog = catalog
        return self._catalog

    @staticmethod
    def _first_split(info: ServerInfo) -> str:
        if not info.datasets:
            raise BadRolloutRequest("the server serves no dataset, so there is no split to take tasks from")
        return info.datasets[0].split

    @property
    def live_sessions(self) -> dict[str, int]:
        """Sessions of this factory not yet known to be over, per server URL."""
        return dict(zip((c.server_url for c in self.clients), self._spread.snapshot(), strict=True))

    def _placement(self) -> Placement[ClientT]:
        return Placement(self.clients, self._spread)

    def _backoff(self, clock: Callable[[], float]) -> CapacityBackoff:
        return CapacityBackoff(self.capacity_wait_s, clock)
