"""Our TRL-style environments as OpenEnv resource sessions, so OpenEnv's own harness layer drives them.

    from openenv.core.harness import MCPHarnessAdapter, HarnessRunLimits, build_harness_rollout_func
    from harnesses.env_factory.openenv_sessions import EnvironmentSessionFactory

    factory = EnvironmentSessionFactory("tasks.environments.wordle:WordleEnv",
                                        reward_funcs=[wordle_win, wordle_partial, wordle_invalid])
    session = factory.create({"prompt": "Play.", "secret": "crane"}, seed=1, episode_id="g0-0")
    rollout = MCPHarnessAdapter().run_white_box(model_step, session, HarnessRunLimits(max_turns=6))
    session.verify(rollout.messages).env_reward         # the reward functions' weighted nansum, or None
    session.close()

    rollout_func = build_harness_rollout_func(session_factory=factory, harness_adapter=MCPHarnessAdapter(),
                                              model_step_builder=lambda trainer, session: model_step)

OpenEnv's contract (openenv/core/harness/rollout.py, openenv 0.10.0: `ResourceSession`,
`ResourceSessionFactory`, `ToolResult`, `VerifyResult`) is implemented here over the same pieces our
own loop uses (`EnvironmentFactory` for reset and tool calls, `initial_messages`, the reward table), so
an episode sees the same prompt, tools and tool messages either way:

- `create(task, seed, episode_id)` makes one environment instance and calls `reset(**row)`; the task is
  a row (a mapping: its `prompt`, else `instruction`, is the prompt; every column goes to reset, as TRL
  does), a prompt string or message list, or None. `seed` and `episode_id` join the row.
- `list_tools()`: the discovered tools as MCP `Tool`s (name, description, the JSON schema's parameters).
- `call_tool()` returns the tool's text as `data`; a tool that raises, an unknown tool or bad arguments
  give `ToolResult(error=...)` with the same text as `data` too, because OpenEnv's MCPHarnessAdapter puts
  only `data` into the tool message and the model must see its error to recover, as in our loop.
  `done` is the environment's `done` after the call.
- `verify()` calls the reward functions (default `env.reward`) as TRL does and returns their weighted
  nansum as `env_reward`, each function's score in `metrics`; None when no function scored the episode
  (unscoreable), never 0.

The methods are synchronous, as OpenEnv's are; async environments run on an event loop of the session's
own (or on `loop`, one running in another thread, e.g. where a sandbox lives).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from harnesses.env_factory.contract import EnvironmentFactory
from harnesses.env_factory.errors import EpisodeError, OpenEnvMissingError, RewardFunctionError
from harnesses.env_factory.loop import error_text, initial_messages
from harnesses.env_factory.rewards import (
    RewardFunc,
    compute_rewards,
    env_attribute,
    load_reward_function,
    reward_columns,
)

try:
    from openenv.core.env_server.mcp_types import Tool as MCPTool
    from openenv.core.harness import ResourceSession, ResourceSessionFactory, ToolResult, VerifyResult
except ImportError as exc:  # the `openenv` extra is not installed
    raise OpenEnvMissingError("harnesses.env_factory.openenv_sessions", exc) from exc

T = TypeVar("T")
Message = dict[str, Any]


class _CoroutineRunner:
    """Runs the environment's coroutines from OpenEnv's synchronous calls, all on one event loop, so
    whatever reset() made (locks, clients) is still on its loop at the next tool call."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._own: asyncio.AbstractEventLoop | None = None

    def check_context(self) -> None:
        """Raise (before anything runs) when called where the coroutine could not run."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._loop is not None and running is self._loop:
            raise RuntimeError(
                "an EnvironmentResourceSession bound to this event loop was called on the loop's own "
                "thread, which would deadlock: call it from a worker thread (asyncio.to_thread)"
            )
        if self._loop is None:
            raise RuntimeError(
                "EnvironmentResourceSession is synchronous (OpenEnv's ResourceSession) and was called "
                "inside a running event loop: run OpenEnv's harness in a worker thread "
                "(asyncio.to_thread(adapter.run_white_box, ...)), or give the factory loop=<that loop>"
            )

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            self.check_context()
        except RuntimeError:
            coroutine.close()
            raise
        if self._loop is not None:
            future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
            return future.result()
        if self._own is None:
            self._own = asyncio.new_event_loop()
        return self._own.run_until_complete(coroutine)

    def close(self) -> None:
        if self._own is None or self._own.is_closed():
            return
        # Sync tools ran in this loop's default executor (asyncio.to_thread): stop its threads. Closed
        # from inside another running loop that cannot run; the idle threads then end with the executor.
        with contextlib.suppress(RuntimeError):
            self._own.run_until_complete(self._own.shutdown_default_executor())
        self._own.close()


def mcp_tools(factory: EnvironmentFactory) -> list[MCPTool]:
    """The environment's tools as OpenEnv/MCP `Tool`s, from the schemas `discover_tools` built
    (openenv/core/env_server/mcp_types.py `Tool`: name, description, input_schema)."""
    tools = []
    for tool in factory.tools.values():
        function = tool.schema["function"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        tools.append(MCPTool(name=tool.name, description=function["description"], input_schema=parameters))
    return tools


def _prompt_and_row(task: Any) -> tuple[str | list[Message], dict[str, Any]]:
    if task is None:
        return [], {}
    if isinstance(task, str):
        return task, {}
    if isinstance(task, Mapping):
        row = dict(task)
        prompt = row.get("prompt", row.get("instruction"))
        if prompt is None:
            return [], row
        if not isinstance(prompt, str | list):
            raise TypeError(
                f"the task's prompt must be a string or a list of chat messages, got {type(prompt).__name__}"
            )
        return prompt, row
    if isinstance(task, list):
        return task, {}
    raise TypeError(
        f"task must be a row (a mapping of dataset columns), a prompt string, a list of chat messages or "
        f"None, got {type(task).__name__}"
    )


# openenv/core/harness/rollout.py (openenv 0.10.0): ResourceSession, the five abstract methods.
class EnvironmentResourceSession(ResourceSession):
    """One reset instance of a TRL-style environment class, as an OpenEnv `ResourceSession`."""

    def __init__(
        self,
        factory: EnvironmentFactory,
        task: Any = None,
        *,
        seed: int | None = None,
        episode_id: str | None = None,
        reward_funcs: Sequence[RewardFunc],
        reward_weights: Sequence[float] | None = None,
        row: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        stop_when_done: bool = True,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        prompt, task_row = _prompt_and_row(task)
        self.factory = factory
        self.row: dict[str, Any] = {**(row or {}), **task_row}
        if seed is not None:
            self.row["seed"] = seed
        if episode_id is not None:
            self.row["episode_id"] = episode_id
        self.reward_funcs = list(reward_funcs)
        self.reward_weights = None if reward_weights is None else list(reward_weights)
        self.stop_when_done = stop_when_done
        self.env = factory.create()
        self._runner = _CoroutineRunner(loop)
        self._runner.check_context()
        self._closed = False
        try:
            observation = self._runner.run(factory.reset(self.env, self.row))
        except Exception as exc:
            self.close()
            raise EpisodeError(
                f"{factory.name}.reset() failed for episode {episode_id!r}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            self._initial = initial_messages(prompt, observation, system_prompt)
        except BaseException:
            self.close()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the session of {self.factory.name} is closed")

    def _env_done(self) -> bool:
        return self.stop_when_done and getattr(self.env, "done", False) is True

    def initial_messages(self) -> list[Message]:
        return [dict(m) for m in self._initial]

    def list_tools(self) -> list[MCPTool]:
        return mcp_tools(self.factory)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self._check_open()
        try:
            output = self._runner.run(self.factory.call_tool(self.env, name, arguments))
        except Exception as exc:  # the model's mistake or the tool's failure: feedback, not the end
            text = error_text(exc)
            # rollout.py (openenv 0.10.0): MCPHarnessAdapter writes only `data` into the tool message,
            # so the error text goes there too; `error` marks the call failed for OpenEnv's trace.
            return ToolResult(data=text, error=text, done=self._env_done())
        # No reward in `metadata`: OpenEnv reads metadata["reward"] as the environment's reward and
        # requires verify() to agree with the last one (rollout.py `_resolve_env_reward`); ours is
        # computed once, by the reward functions in verify().
        return ToolResult(data=output, done=self._env_done())

    def verify(self, transcript: list[Message], final_state: Any | None = None) -> VerifyResult:
        """The reward functions over this episode; `final_state` (OpenEnv's rollout summary) is not
        needed, the environment instance holds the state they score."""
        self._check_open()
        messages = [dict(m) for m in transcript]
        n = len(self._initial)
        completion = messages[n:] if messages[:n] == self._initial else messages
        columns = reward_columns(self.row, self.initial_messages(), completion)
        table = compute_rewards(self.reward_funcs, [self.env], self.reward_weights, **columns)
        return VerifyResult(
            env_reward=table.totals()[0],
            done=getattr(self.env, "done", False) is True,
            metrics=table.row(0),
            artifacts={"environment": self.factory.name, "transcript_length": len(messages)},
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._runner.close()


# openenv/core/harness/rollout.py (openenv 0.10.0): ResourceSessionFactory.create(task, seed, episode_id).
class EnvironmentSessionFactory(ResourceSessionFactory[EnvironmentResourceSession]):
    """A TRL-style environment class and its reward functions as an OpenEnv `ResourceSessionFactory`.

    `environment`: the class, `module:Class`, or an `EnvironmentFactory` (checked against the contract
    now, not at the first rollout). `reward_funcs` (functions or `module:function`; default `env.reward`)
    and `reward_weights` as TRL takes them. `row`: columns every episode's reset gets, under the task's
    own. `loop`: an event loop running in another thread for async environments whose resources live
    there (a sandbox); the sessions must then be called off that loop's thread.
    """

    def __init__(
        self,
        environment: str | type | EnvironmentFactory,
        *,
        reward_funcs: Sequence[RewardFunc | str] | None = None,
        reward_weights: Sequence[float] | None = None,
        row: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        stop_when_done: bool = True,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.environment = (
            environment if isinstance(environment, EnvironmentFactory) else EnvironmentFactory(environment)
        )
        funcs = [load_reward_function(f) if isinstance(f, str) else f for f in reward_funcs or ()]
        self.reward_funcs: list[RewardFunc] = funcs or [env_attribute("reward")]
        if reward_weights is not None and len(reward_weights) != len(self.reward_funcs):
            raise RewardFunctionError(
                f"{len(reward_weights)} reward weights for {len(self.reward_funcs)} reward functions"
            )
        self.reward_weights = None if reward_weights is None else list(reward_weights)
        self.row = dict(row or {})
        self.system_prompt = system_prompt
        self.stop_when_done = stop_when_done
        self.loop = loop

    @property
    def name(self) -> str:
        return self.environment.name

    def create(
        self, task: Any = None, seed: int | None = None, episode_id: str | None = None
    ) -> EnvironmentResourceSession:
        return EnvironmentResourceSession(
            self.environment,
            task,
            seed=seed,
            episode_id=episode_id,
            reward_funcs=self.reward_funcs,
            reward_weights=self.reward_weights,
            row=self.row,
            system_prompt=self.system_prompt,
            stop_when_done=self.stop_when_done,
            loop=self.loop,
        )


__all__ = ["EnvironmentResourceSession", "EnvironmentSessionFactory", "mcp_tools"]
