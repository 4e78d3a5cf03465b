"""RolloutRunner: the steps of one rollout, from its capture session to its stored result.

A rollout is: create a capture session (its id is the rollout's id) -> start the task's sandbox with
the harness's image layer -> run the harness under the agent timeout, pointed at the session -> run
the task's verifier -> write the result into the session's store record -> stop the sandbox (in
`finally`, so a failure or a cancel never leaks one). The store record is the source of truth: a
finished rollout is read back from it, which is why results survive a server restart.

The session is opened on the server's own loop (the "home" loop); every later step runs in the
rollout's task on the worker loop (see `harbor_server.rollouts.WorkerLoop`). The two meet in few
places, each marked: results go home with `call_soon_threadsafe` / `run_coroutine_threadsafe`;
store calls go to threads from either side. Which rollouts exist, and how many may, is the
`RolloutManager`'s business, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from capture_proxy.config import normalize_engine_url
from capture_proxy.errors import ProxyRequestError
from capture_proxy.models import SessionCreate
from capture_proxy.service import CaptureService
from capture_proxy.store import ROLLOUT_KEY, TraceStore
from harbor_server.config import ServeConfig
from harbor_server.engine_check import engine_context_length
from harbor_server.errors import BadRolloutRequest, HarborServerError
from harbor_server.models import RolloutPhase, RolloutRequest, RolloutState, RolloutStatus
from harnesses import MODEL_FREE_HARNESSES, AgentOutcome, AgentRun, Harness
from sandboxes import Sandbox, SandboxBackend
from sandboxes.errors import SandboxError
from tasks import Task, verify

log = logging.getLogger(__name__)

AGENT_TIMEOUT_GRACE_S = 60.0
"""Harnesses enforce the agent timeout inside the sandbox; this backstop fires that much later."""
RECANCEL_INTERVAL_S = 1.0
"""A cancelled rollout whose task is still running after this long is cancelled again."""
LOG_TAIL_CHARS = 4000


@dataclass
class LiveRollout:
    """A rollout this process is running."""

    rollout_id: str
    request: RolloutRequest
    task: Task
    harness: Harness
    backend_name: str
    backend: SandboxBackend
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


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


class RolloutRunner:
    """Takes each rollout it is handed through its steps and records how it ended in the store."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        store: TraceStore,
        service: CaptureService,
        on_done: Callable[[LiveRollout], None],
    ) -> None:
        self.config = config
        self.store = store
        self.service = service
        self._on_done = on_done
        """Called on the home loop once a rollout's end is recorded (or recording it failed)."""
        self._context_lengths: dict[tuple[str, str], int | None] = {}
        """(engine URL, model) -> the engine's max_model_len; asked once per engine, not per rollout."""
        self.home: asyncio.AbstractEventLoop | None = None
        """The home loop; the manager sets it when it starts, before any rollout runs."""

    # -- on the home loop ------------------------------------------------------------------------

    async def open_session(
        self,
        request: RolloutRequest,
        task: Task,
        harness: Harness,
        backend_name: str,
        backend: SandboxBackend,
        llm_url: str,
        model: str,
    ) -> LiveRollout:
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
            api_key=request.api_key or (self.config.llm_api_key if request.llm_url is None else None),
            auth_header=request.auth_header if request.api_key else None,
            sampling=request.sampling,
            purpose=request.purpose,
            max_model_calls=request.agent_step_limit,
            # A harness may declare that one model call can be a whole rollout (env-factory does).
            multi_step_task=request.harness not in MODEL_FREE_HARNESSES
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
        return LiveRollout(
            rollout_id=created.session_id,
            request=request,
            task=task,
            harness=harness,
            backend_name=backend_name,
            backend=backend,
            llm_url=llm_url,
            model=model,
            agent_key=created.api_key,
            created_at=time.time(),
            meta=meta,
        )

    # -- on the worker loop ----------------------------------------------------------------------

    def spawn(self, live: LiveRollout) -> None:
        live.runner = asyncio.get_running_loop().create_task(
            self._run(live), name=f"rollout-{live.rollout_id}"
        )
        live.runner.add_done_callback(lambda _: self._finish_unstarted(live))

    def _finish_unstarted(self, live: LiveRollout) -> None:
        """A task cancelled before its first step never runs its body: record it here instead."""
        if not live.started:
            ending = _Ending(status="cancelled", error=live.cancel_reason or "cancelled")
            asyncio.ensure_future(self._finish(live, None, ending, time.monotonic()))

    def cancel_on_worker(self, live: LiveRollout) -> None:
        """Cancel the rollout's task, and again each second until its cleanup begins: code below us
        (a library's `asyncio.wait_for` on Python 3.11, gh-86296) may swallow one cancel."""
        runner = live.runner
        if runner is None or runner.done() or live.phase == "stopping":
            return
        runner.cancel()
        asyncio.get_running_loop().call_later(RECANCEL_INTERVAL_S, self.cancel_on_worker, live)

    async def _run(self, live: LiveRollout) -> None:
        live.started = True
        ending = _Ending()
        started = time.monotonic()
        # One line at each end of every rollout, at the default level: what `harbor serve` is doing.
        log.info(
            "rollout %s started: task %s, harness %s, sandbox %s",
            live.rollout_id,
            live.task.id,
            live.request.harness,
            live.backend_name,
        )
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

    async def _start_sandbox(self, live: LiveRollout, ending: _Ending) -> Sandbox:
        t0 = time.monotonic()
        spec = live.task.sandbox_spec(f"harbor-{live.rollout_id[:16]}", proxy_port=self.config.capture_port)
        # May fetch the harness's pinned packages on first use (pip download, npm pack): off the loop.
        layer = await asyncio.to_thread(live.harness.image_layer)
        if layer is not None:
            spec.image_layers.append(layer)
        try:
            sandbox = await live.backend.start(spec)
        except SandboxError as exc:
            raise HarborServerError(f"sandbox {live.backend_name!r} did not start: {exc}") from exc
        finally:
            ending.timings["sandbox_start"] = time.monotonic() - t0
        live.sandbox = sandbox
        return sandbox

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

    async def _context_length(self, live: LiveRollout) -> int | None:
        """The engine's context length, so a harness can keep its agent's requests inside it (opencode
        asks for 32,000 completion tokens by default, which a 32k-context engine refuses)."""
        if live.request.harness in MODEL_FREE_HARNESSES:
            return None
        key = (live.llm_url, live.model)
        if key not in self._context_lengths:
            api_key = self.config.llm_api_key if live.request.llm_url is None else None
            try:
                self._context_lengths[key] = await engine_context_length(
                    normalize_engine_url(live.llm_url), live.model, api_key=api_key
                )
            except (httpx.HTTPError, ValueError) as exc:  # not cached: the next rollout asks again
                log.warning("could not read the context length of %s: %r", live.llm_url, exc)
                return None
        return self._context_lengths[key]

    async def _run_agent(self, live: LiveRollout, sandbox: Sandbox, ending: _Ending) -> None:
        request, task = live.request, live.task
        timeout_s = request.agent_timeout_sec or task.config.agent.timeout_sec
        context_length = await self._context_length(live)
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
            context_length=context_length,
            max_tokens=request.sampling.max_tokens,
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

    async def _verify(self, live: LiveRollout, sandbox: Sandbox, ending: _Ending) -> None:
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

    async def _finish(
        self, live: LiveRollout, sandbox: Sandbox | None, ending: _Ending, started: float
    ) -> None:
        try:
            if sandbox is not None:
                ending.timings["sandbox_stop"] = await self._stop_sandbox(live, sandbox)
            ending.timings["total"] = time.monotonic() - started
            await self._persist(live, ending)
            _log_end(live, ending)
        except Exception:
            log.exception("could not record the end of rollout %s", live.rollout_id)
        finally:
            self._on_home(self._on_done, live)

    def _on_home(self, callback, *args) -> None:
        assert self.home is not None
        self.home.call_soon_threadsafe(callback, *args)

    async def _stop_sandbox(self, live: LiveRollout, sandbox: Sandbox) -> float:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.config.sandbox_stop_timeout_s):
                await sandbox.stop()
        except Exception as exc:
            log.error("sandbox of rollout %s did not stop cleanly: %r", live.rollout_id, exc)
        return time.monotonic() - t0

    async def _persist(self, live: LiveRollout, ending: _Ending) -> None:
        outcome = ending.outcome or AgentOutcome()
        facts = dict(live.meta) | {
            "timed_out": ending.timed_out,
            "tool_calls_by_name": dict(outcome.tool_calls_by_name),
            "tool_failures": outcome.tool_failures,
            "tool_failures_by_name": dict(outcome.tool_failures_by_name),
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
        assert self.home is not None
        closing = asyncio.run_coroutine_threadsafe(
            self.service.close_session(live.rollout_id, ending.status), self.home
        )
        await asyncio.wrap_future(closing)


def _log_end(live: LiveRollout, ending: _Ending) -> None:
    reward = "none (unscoreable)" if ending.reward is None else f"{ending.reward:g}"
    error = (ending.error or "").strip().splitlines()
    log.info(
        "rollout %s %s: task %s, harness %s, sandbox %s, reward %s, %.1f s%s",
        live.rollout_id,
        ending.status,
        live.task.id,
        live.request.harness,
        live.backend_name,
        reward,
        ending.timings.get("total", 0.0),
        f" ({error[0][:200]})" if error else "",
    )


def _raise_if_cancelled(live: LiveRollout) -> None:
    """A cancel swallowed inside a short sandbox step is repeated within a second, but the next step
    may have begun by then; the request is also recorded on `live`, so check it between steps."""
    if live.cancel_reason is not None:
        raise asyncio.CancelledError(live.cancel_reason)
