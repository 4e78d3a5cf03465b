"""RolloutManager: one asyncio task per rollout, from capture session to verified, stored result.

A rollout is: create a capture session (its id is the rollout's id) -> start the task's sandbox with
the harness's image layer -> run the harness under the agent timeout, pointed at the session -> run
the task's verifier -> write the result into the session's store record -> stop the sandbox (in
`finally`, so a failure or a cancel never leaks one). The store record is the source of truth: a
finished rollout is read back from it, which is why results survive a server restart.

Two event loops. The server's own loop (the "home" loop) answers HTTP on both ports, holds the
rollout table and the capture service. Sandbox, harness and verifier work runs on a second loop in
its own thread (`WorkerLoop`): starting a sandbox process costs milliseconds of the calling thread
each (fork/exec), and with hundreds of them the home loop would stall health checks and agents'
model calls. The two meet in few places, each marked: the worker hands results back with
`call_soon_threadsafe` / `run_coroutine_threadsafe`; store calls go to threads from either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capture_proxy.config import normalize_engine_url
from capture_proxy.errors import InvalidTraceError, ProxyRequestError, SessionNotFound
from capture_proxy.models import SessionCreate, TrainingTrace
from capture_proxy.service import CaptureService
from capture_proxy.store import SessionRecord, TraceStore
from harbor_server.config import ServeConfig
from harbor_server.errors import (
    BadRolloutRequest,
    CapacityExceeded,
    HarborServerError,
    RolloutNotFinished,
    RolloutNotFound,
    TaskIndexOutOfRange,
    TraceNotTrainable,
)
from harbor_server.models import (
    TERMINAL_STATUSES,
    Capacity,
    RolloutPhase,
    RolloutRequest,
    RolloutResult,
    RolloutState,
    RolloutStatus,
)
from harnesses import AgentOutcome, AgentRun, Harness, UnknownHarness, get_harness, harness_names
from sandboxes import BACKENDS, Sandbox, SandboxBackend, get_backend
from sandboxes.errors import SandboxError, SandboxUnavailable
from tasks import Dataset, Task, TaskNotFound, verify

log = logging.getLogger(__name__)

ROLLOUT_KEY = "rollout"
"""Key of the session record's metadata under which the server keeps a rollout's own facts."""
ONE_SHOT_HARNESSES = frozenset({"nop", "oracle"})
"""Harnesses that make no model calls; every other harness drives a multi-step agent."""
AGENT_TIMEOUT_GRACE_S = 60.0
"""Harnesses enforce the agent timeout inside the sandbox; this backstop fires that much later."""
RECANCEL_INTERVAL_S = 1.0
"""A cancelled rollout whose task is still running after this long is cancelled again."""
RESTART_REASON = "the server stopped while this rollout was running (restart or crash)"
LOG_TAIL_CHARS = 4000

HarnessFactory = Callable[[str], Harness]


@dataclass
class _Live:
    """A rollout this process is running."""

    rollout_id: str
    request: RolloutRequest
    task: Task
    harness: Harness
    backend_name: str
    llm_url: str
    model: str
    agent_key: str
    created_at: float
    meta: dict[str, Any]
    phase: RolloutPhase = "starting"
    runner: asyncio.Task | None = None
    """The rollout's task on the worker loop (touch it only from there)."""
    started: bool = False
    """Set by the worker when the task's body begins (a task cancelled before that never runs it)."""
    sandbox: Sandbox | None = None
    cancel_reason: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    """Set on the home loop once the result is stored."""

    def state(self) -> RolloutState:
        return RolloutState(
            rollout_id=self.rollout_id,
            status="running",
            phase=self.phase,
            task_id=self.task.id,
            split=self.request.split,
            harness=self.request.harness,
            sandbox=self.backend_name,
            created_at=self.created_at,
        )


@dataclass
class _Ending:
    """What the rollout's run found out, written to the store when it ends."""

    status: RolloutStatus = "failed"
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False
    outcome: AgentOutcome | None = None
    verifier_output: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def result_from_record(record: SessionRecord) -> RolloutResult:
    """The rollout's result as the store holds it (the same before and after a restart)."""
    facts = dict(record.metadata.get(ROLLOUT_KEY) or {})
    return RolloutResult(
        rollout_id=record.session_id,
        status=record.status,
        task_id=record.task_id,
        split=facts.get("split"),
        harness=record.harness,
        sandbox=record.sandbox,
        model=record.model,
        env_reward=record.reward,
        rewards=dict(record.rewards),
        timed_out=bool(facts.get("timed_out", False)),
        tool_calls_by_name=dict(facts.get("tool_calls_by_name") or {}),
        tool_failures=int(facts.get("tool_failures") or 0),
        error=record.error,
        timings=dict(facts.get("timings") or {}),
        num_turns=record.num_turns,
        episode_id=facts.get("episode_id"),
        seed=facts.get("seed"),
        agent_exit_code=facts.get("agent_exit_code"),
        agent_log_tail=facts.get("agent_log_tail") or "",
        verifier_output=facts.get("verifier_output") or "",
        metadata=dict(facts.get("metadata") or {}),
    )


def state_from_record(record: SessionRecord) -> RolloutState:
    done = record.status in TERMINAL_STATUSES
    facts = record.metadata.get(ROLLOUT_KEY) or {}
    return RolloutState(
        rollout_id=record.session_id,
        status=record.status,
        phase="done" if done else "starting",
        task_id=record.task_id,
        split=facts.get("split"),
        harness=record.harness,
        sandbox=record.sandbox,
        created_at=record.created_at,
        finished_at=record.finished_at,
        result=result_from_record(record) if done else None,
    )


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


class WorkerLoop:
    """An event loop on its own daemon thread, for the rollouts' sandbox work."""

    def __init__(self, name: str = "harbor-rollouts") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    def call(self, callback, *args) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    async def run(self, coro):
        """Await `coro` run on the worker loop, from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


class RolloutManager:
    """Starts, tracks, cancels and reports rollouts; everything it finishes is in the store."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        store: TraceStore,
        service: CaptureService,
        datasets: Mapping[str, Dataset],
        backends: Mapping[str, SandboxBackend] | None = None,
        harness_factory: HarnessFactory = get_harness,
        harness_list: Callable[[], list[str]] = harness_names,
    ) -> None:
        self.config = config
        self.store = store
        self.service = service
        self.datasets = dict(datasets)
        self._backends: dict[str, SandboxBackend] = dict(backends or {})
        self._harness_factory = harness_factory
        self._harness_list = harness_list
        self._live: dict[str, _Live] = {}
        self._reserved = 0
        """Slots taken by requests still creating their session (so a burst cannot overshoot capacity)."""
        self._closing = False
        self._home: asyncio.AbstractEventLoop | None = None
        self._worker = WorkerLoop()

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> int:
        """Mark rollouts a previous run of this server (same server id) left running as failed; returns
        how many there were."""
        self._home = asyncio.get_running_loop()
        self._worker.start()
        # Only this server's own leftovers: other servers sharing the store may be running theirs.
        orphans = await asyncio.to_thread(
            self.store.mark_running_failed, RESTART_REASON, owner=self.config.server_id
        )
        if orphans:
            log.warning(
                "marked %d rollout(s) left running by a previous run of server %r as failed",
                orphans,
                self.config.server_id,
            )
        return orphans

    async def stop(self) -> None:
        """Cancel every live rollout (their sandboxes are stopped) and wait for them to be recorded."""
        self._closing = True
        live = list(self._live.values())
        for rollout in live:
            self._cancel(rollout, "the server shut down during this rollout")
        await asyncio.gather(*(r.done.wait() for r in live))
        if self._home is not None:  # started: backends' loop-bound state lives on the worker
            await self._worker.run(self._close_backends())
        self._worker.stop()

    async def _close_backends(self) -> None:
        for backend in self._backends.values():
            aclose = getattr(backend, "aclose", None)  # not in the protocol; docker has one
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    log.exception("sandbox backend %s did not close cleanly", backend.name)

    # -- what the server offers ------------------------------------------------------------------

    def harnesses(self) -> list[str]:
        return self._harness_list()

    @property
    def capacity(self) -> Capacity:
        return Capacity(max_concurrent_envs=self.config.max_concurrent_envs, live=self.live_count)

    @property
    def live_count(self) -> int:
        return len(self._live) + self._reserved

    def dataset(self, split: str) -> Dataset:
        try:
            return self.datasets[split]
        except KeyError:
            raise BadRolloutRequest(
                f"unknown split {split!r}; this server has: {', '.join(sorted(self.datasets))}"
            ) from None

    def backend(self, name: str) -> SandboxBackend:
        """The backend called `name`, created on first use."""
        if name not in BACKENDS:
            raise BadRolloutRequest(f"unknown sandbox {name!r}; choose one of {', '.join(BACKENDS)}")
        if name not in self._backends:
            try:
                self._backends[name] = get_backend(name, **self._backend_options(name))
            except SandboxUnavailable as exc:
                raise HarborServerError(
                    f"sandbox backend {name!r} is unavailable: {exc}", status=503
                ) from exc
            except ImportError as exc:
                raise HarborServerError(
                    f"sandbox backend {name!r} needs a package that is not installed: {exc}", status=503
                ) from exc
        return self._backends[name]

    def _backend_options(self, name: str) -> dict[str, Any]:
        if name == "e2b" and self.config.public_url is not None:
            # The backend wants the capture port's public base URL without the OpenAI /v1 suffix.
            return {"proxy_url": self.config.public_url.removesuffix("/v1")}
        return {}

    # -- submitting ------------------------------------------------------------------------------

    def _resolve_task(self, request: RolloutRequest) -> Task:
        dataset = self.dataset(request.split)
        if request.task_index is not None:
            if request.task_index >= len(dataset):
                raise TaskIndexOutOfRange(
                    f"task_index {request.task_index} is out of range: split {request.split!r} has "
                    f"{len(dataset)} task(s) (indices 0..{len(dataset) - 1})"
                )
            return dataset[request.task_index]
        try:
            return dataset.get(request.task_id or "")
        except TaskNotFound as exc:
            raise BadRolloutRequest(f"task_id: {exc}", status=404) from None

    def _resolve_harness(self, name: str, task: Task) -> Harness:
        if name not in self.harnesses():
            raise BadRolloutRequest(f"unknown harness {name!r}; available: {', '.join(self.harnesses())}")
        try:
            harness = self._harness_factory(name)
        except UnknownHarness as exc:
            raise BadRolloutRequest(str(exc)) from None
        if name == "oracle" and not task.paths.has_solution:
            raise BadRolloutRequest(
                f"task {task.id!r} has no solution/solve.sh, so the oracle harness cannot run it"
            )
        return harness

    def _resolve_engine(self, request: RolloutRequest) -> tuple[str, str]:
        llm_url = request.llm_url or self.config.llm_url
        if llm_url is None:
            raise BadRolloutRequest(
                "llm_url is missing: give it in the request or start harbor serve with --llm-url"
            )
        try:
            llm_url = normalize_engine_url(llm_url)
        except ValueError as exc:
            raise BadRolloutRequest(f"llm_url: {exc}") from None
        model = request.model or self.config.model
        if model is None:
            raise BadRolloutRequest(
                "model is missing: give it in the request or start harbor serve with --model"
            )
        return llm_url, model

    def _agent_base_url(self, backend_name: str, sandbox: Sandbox) -> str:
        """The capture port as the agent inside `sandbox` reaches it (remote backends: a public URL)."""
        public = getattr(sandbox, "proxy_url", None)
        if public:
            return normalize_engine_url(public)
        if backend_name == "e2b":
            raise BadRolloutRequest(
                "e2b sandboxes need --expose direct --public-url URL (the capture port's URL)"
            )
        return f"http://{sandbox.proxy_host}:{self.config.capture_port}/v1"

    def _host_base_url(self) -> str:
        """The capture port as this host reaches it (env-factory runs its loop here, not in the sandbox)."""
        host = self.config.capture_host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.config.capture_port}/v1"

    async def submit(self, request: RolloutRequest) -> RolloutState:
        """Validate, take a slot (429 when none is free), create the capture session, start the task."""
        if self._closing:
            raise HarborServerError("the server is shutting down", status=503)
        task = self._resolve_task(request)
        harness = self._resolve_harness(request.harness, task)
        backend_name = request.sandbox or self.config.sandbox
        self.backend(backend_name)
        if backend_name == "e2b" and self.config.public_url is None:
            raise BadRolloutRequest(
                "e2b sandboxes need --expose direct --public-url URL (the capture port's URL)"
            )
        llm_url, model = self._resolve_engine(request)
        if self.live_count >= self.config.max_concurrent_envs:
            raise CapacityExceeded(
                f"{self.live_count} rollouts are live, the limit is MAX_CONCURRENT_ENVS="
                f"{self.config.max_concurrent_envs}; retry when one finishes"
            )
        self._reserved += 1
        try:
            live = await self._open_session(request, task, harness, backend_name, llm_url, model)
        finally:
            self._reserved -= 1
        self._live[live.rollout_id] = live
        self._worker.call(self._spawn, live)
        return live.state()

    # -- on the worker loop ----------------------------------------------------------------------

    def _spawn(self, live: _Live) -> None:
        live.runner = asyncio.get_running_loop().create_task(
            self._run(live), name=f"rollout-{live.rollout_id}"
        )
        live.runner.add_done_callback(lambda _: self._finish_unstarted(live))

    def _finish_unstarted(self, live: _Live) -> None:
        """A task cancelled before its first step never runs its body: record it here instead."""
        if not live.started:
            ending = _Ending(status="cancelled", error=live.cancel_reason or "cancelled")
            asyncio.ensure_future(self._finish(live, None, ending, time.monotonic()))

    def _cancel_on_worker(self, live: _Live) -> None:
        """Cancel the rollout's task, and again each second until its cleanup begins: code below us
        (a library's `asyncio.wait_for` on Python 3.11, gh-86296) may swallow one cancel."""
        runner = live.runner
        if runner is None or runner.done() or live.phase == "stopping":
            return
        runner.cancel()
        asyncio.get_running_loop().call_later(RECANCEL_INTERVAL_S, self._cancel_on_worker, live)

    async def _open_session(
        self,
        request: RolloutRequest,
        task: Task,
        harness: Harness,
        backend_name: str,
        llm_url: str,
        model: str,
    ) -> _Live:
        meta = {
            "split": request.split,
            "task_index": request.task_index,
            "episode_id": request.episode_id,
            "seed": request.seed,
            "metadata": request.metadata,
        }
        spec = SessionCreate(
            llm_url=llm_url,
            model=model,
            api_key=self.config.llm_api_key if request.llm_url is None else None,
            sampling=request.sampling,
            purpose=request.purpose,
            max_model_calls=request.agent_step_limit,
            # A harness may declare that one model call can be a whole rollout (env-factory does).
            multi_step_task=request.harness not in ONE_SHOT_HARNESSES
            and getattr(harness, "multi_step_task", True),
            metadata={ROLLOUT_KEY: meta},
        )
        try:
            created = await self.service.create_session(
                spec,
                # Where a sandbox reaches us is only known once it runs; the agent gets that URL.
                base_url=f"http://127.0.0.1:{self.config.capture_port}/v1",
                task_id=task.id,
                harness=request.harness,
                sandbox=backend_name,
                owner=self.config.server_id,
            )
        except ProxyRequestError as exc:
            raise BadRolloutRequest(exc.message, status=exc.status if exc.status < 500 else 400) from exc
        return _Live(
            rollout_id=created.session_id,
            request=request,
            task=task,
            harness=harness,
            backend_name=backend_name,
            llm_url=llm_url,
            model=model,
            agent_key=created.api_key,
            created_at=time.time(),
            meta=meta,
        )

    # -- running ---------------------------------------------------------------------------------

    async def _run(self, live: _Live) -> None:
        live.started = True
        ending = _Ending()
        started = time.monotonic()
        sandbox: Sandbox | None = None
        try:
            live.phase = "sandbox"
            sandbox = await self._start_sandbox(live, ending)
            _raise_if_cancelled(live)
            live.phase = "agent"
            await self._run_agent(live, sandbox, ending)
            if ending.status != "failed":
                live.phase = "verifying"
                await self._verify(live, sandbox, ending)
        except asyncio.CancelledError:
            ending.status, ending.error = "cancelled", live.cancel_reason or "cancelled"
            ending.reward, ending.rewards = None, {}
        except HarborServerError as exc:
            ending.status, ending.error = "failed", exc.message
        except Exception as exc:  # a rollout's failure is its result, never the server's crash
            log.exception("rollout %s failed", live.rollout_id)
            ending.status, ending.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            live.phase = "stopping"
            # Cleanup runs in its own task: a second cancel of this one cannot interrupt it.
            cleanup = asyncio.ensure_future(self._finish(live, sandbox, ending, started))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(cleanup)

    async def _start_sandbox(self, live: _Live, ending: _Ending) -> Sandbox:
        t0 = time.monotonic()
        spec = live.task.sandbox_spec(f"harbor-{live.rollout_id[:16]}", proxy_port=self.config.capture_port)
        # May fetch the harness's pinned packages on first use (pip download, npm pack): off the loop.
        layer = await asyncio.to_thread(live.harness.image_layer)
        if layer is not None:
            spec.image_layers.append(layer)
        try:
            sandbox = await self.backend(live.backend_name).start(spec)
        except SandboxError as exc:
            raise HarborServerError(f"sandbox {live.backend_name!r} did not start: {exc}") from exc
        finally:
            ending.timings["sandbox_start"] = time.monotonic() - t0
        live.sandbox = sandbox
        return sandbox

    async def _run_agent(self, live: _Live, sandbox: Sandbox, ending: _Ending) -> None:
        request, task = live.request, live.task
        timeout_s = request.agent_timeout_sec or task.config.agent.timeout_sec
        run = AgentRun(
            instruction=task.instruction,
            base_url=self._agent_base_url(live.backend_name, sandbox),
            api_key=live.agent_key,
            model=live.model,
            workdir=task.config.environment.workdir,
            timeout_s=timeout_s,
            step_limit=request.agent_step_limit,
            purpose=request.purpose,
            solution_dir=task.paths.solution_dir if task.paths.has_solution else None,
            extra={
                "seed": request.seed,
                "episode_id": request.episode_id,
                "rollout_id": live.rollout_id,
                "task_metadata": task.config.metadata,  # env-factory reads [metadata.env_factory]
                "host_base_url": self._host_base_url(),  # for harnesses whose loop runs on this host
            },
        )
        t0 = time.monotonic()
        await sandbox.exec(["mkdir", "-p", "/logs/agent", "/logs/verifier"], user="root", timeout_s=30.0)
        _raise_if_cancelled(live)
        try:
            async with asyncio.timeout(timeout_s + AGENT_TIMEOUT_GRACE_S):
                outcome = await live.harness.run(sandbox, run)
        except TimeoutError:
            outcome = AgentOutcome(
                timed_out=True, log_tail=f"the harness did not return within {timeout_s:.0f} s"
            )
        finally:
            ending.timings["agent"] = time.monotonic() - t0
        ending.outcome = outcome
        ending.timed_out = outcome.timed_out
        if outcome.error is not None:
            # The harness itself failed (not the agent's attempt): scoring the untouched task would be
            # a false 0, so the rollout is unscoreable.
            ending.status, ending.error = "failed", f"harness {request.harness!r} failed: {outcome.error}"
        else:
            ending.status = "timed_out" if outcome.timed_out else "completed"

    async def _verify(self, live: _Live, sandbox: Sandbox, ending: _Ending) -> None:
        t0 = time.monotonic()
        result = await verify(sandbox, live.task)
        ending.timings["verifier"] = time.monotonic() - t0
        ending.reward, ending.rewards = result.reward, dict(result.rewards)
        ending.verifier_output = _tail(result.stdout + result.stderr)
        if result.reward is None:
            ending.error = f"verifier gave no reward: {result.error}"
        if not result.ran:  # the sandbox died under the rollout: a failure, not a finished attempt
            ending.status = "failed"
        record = await asyncio.to_thread(self.store.get_session, live.rollout_id)
        if record.error is not None:
            # An engine call failed mid-rollout: what the verifier saw is not the policy's work.
            ending.status, ending.reward = "failed", None
            ending.error = f"rollout unscoreable, a model call failed: {record.error}"

    async def _finish(self, live: _Live, sandbox: Sandbox | None, ending: _Ending, started: float) -> None:
        try:
            if sandbox is not None:
                ending.timings["sandbox_stop"] = await self._stop_sandbox(live, sandbox)
            ending.timings["total"] = time.monotonic() - started
            await self._persist(live, ending)
        except Exception:
            log.exception("could not record the end of rollout %s", live.rollout_id)
        finally:
            self._on_home(self._mark_done, live)

    def _on_home(self, callback, *args) -> None:
        assert self._home is not None
        self._home.call_soon_threadsafe(callback, *args)

    def _mark_done(self, live: _Live) -> None:  # home loop
        live.phase = "done"
        self._live.pop(live.rollout_id, None)
        live.done.set()

    async def _stop_sandbox(self, live: _Live, sandbox: Sandbox) -> float:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.config.sandbox_stop_timeout_s):
                await sandbox.stop()
        except Exception as exc:
            log.error("sandbox of rollout %s did not stop cleanly: %r", live.rollout_id, exc)
        return time.monotonic() - t0

    async def _persist(self, live: _Live, ending: _Ending) -> None:
        outcome = ending.outcome or AgentOutcome()
        facts = dict(live.meta) | {
            "timed_out": ending.timed_out,
            "tool_calls_by_name": dict(outcome.tool_calls_by_name),
            "tool_failures": outcome.tool_failures,
            "agent_exit_code": outcome.exit_code,
            "agent_log_tail": _tail(outcome.log_tail),
            "verifier_output": ending.verifier_output,
            "timings": {k: round(v, 4) for k, v in ending.timings.items()},
        }
        record = await asyncio.to_thread(self.store.get_session, live.rollout_id)
        fields: dict[str, Any] = {
            "status": ending.status,
            "reward": ending.reward,
            "rewards": ending.rewards,
            "metadata": dict(record.metadata) | {ROLLOUT_KEY: facts},
        }
        if ending.error is not None or record.error is None:
            fields["error"] = ending.error
        await asyncio.to_thread(self.store.update_session, live.rollout_id, **fields)
        # Let the capture service (home loop) know: the session key stops working.
        assert self._home is not None
        closing = asyncio.run_coroutine_threadsafe(
            self.service.close_session(live.rollout_id, ending.status), self._home
        )
        await asyncio.wrap_future(closing)

    # -- asking about rollouts -------------------------------------------------------------------

    async def _record(self, rollout_id: str) -> SessionRecord:
        try:
            return await asyncio.to_thread(self.store.get_session, rollout_id)
        except SessionNotFound:
            raise RolloutNotFound(rollout_id) from None

    async def get(self, rollout_id: str) -> RolloutState:
        live = self._live.get(rollout_id)
        if live is not None:
            return live.state()
        return state_from_record(await self._record(rollout_id))

    async def list(
        self,
        *,
        status: RolloutStatus | None = None,
        task_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RolloutState]:
        """Rollouts newest first (live ones with their current phase)."""
        records = await asyncio.to_thread(
            self.store.list_sessions, status=status, task_id=task_id, limit=limit, offset=offset
        )
        states = []
        for record in records:
            live = self._live.get(record.session_id)
            states.append(live.state() if live is not None else state_from_record(record))
        return states

    async def wait(self, rollout_id: str, timeout_s: float) -> RolloutState:
        """The rollout's state once it is done, or after `timeout_s`, whichever comes first."""
        live = self._live.get(rollout_id)
        if live is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.done.wait(), timeout_s)
        return await self.get(rollout_id)

    async def result(self, rollout_id: str) -> RolloutResult:
        state = await self.get(rollout_id)
        if state.result is None:
            raise RolloutNotFinished(f"rollout {rollout_id} is still {state.phase}; wait for it first")
        return state.result

    async def trace(self, rollout_id: str) -> TrainingTrace:
        """The validated, finalized trace; TraceNotTrainable (409) with the findings when it has FATAL ones."""
        await self.result(rollout_id)
        try:
            return await self.service.get_trace(rollout_id)
        except InvalidTraceError as exc:
            findings = [f.model_dump(mode="json") for f in exc.findings]
            raise TraceNotTrainable(str(exc), findings) from exc
        except SessionNotFound:
            raise RolloutNotFound(rollout_id) from None

    async def cancel(self, rollout_id: str) -> RolloutState:
        """Stop the rollout (its sandbox is stopped) and return its final state; a done one is left as is."""
        live = self._live.get(rollout_id)
        if live is None:
            return await self.get(rollout_id)
        self._cancel(live, "cancelled by request")
        await live.done.wait()
        return await self.get(rollout_id)

    def _cancel(self, live: _Live, reason: str) -> None:
        if live.cancel_reason is None:
            live.cancel_reason = reason
            # Queued after `_spawn` on the worker, so the task exists by then.
            self._worker.call(self._cancel_on_worker, live)


def _raise_if_cancelled(live: _Live) -> None:
    """A cancel swallowed inside a short sandbox step is repeated within a second, but the next step
    may have begun by then; the request is also recorded on `live`, so check it between steps."""
    if live.cancel_reason is not None:
        raise asyncio.CancelledError(live.cancel_reason)
