"""The `env-factory` harness: white-box environments under `harbor serve`, captured like any agent.

Unlike the black-box harnesses, nothing is installed in the sandbox: the loop runs here, in the
server's process, and talks to the capture proxy session with the real `openai` client. The
environment decides where its tools act: the echo and word-game environments are pure Python, the
coding environment acts on the task's sandbox (it gets it as the row's `sandbox`).

Which environment runs comes from the harness's constructor, else from the task's `task.toml`:

    [metadata.env_factory]
    environment = "tasks.environments.wordle:WordleEnv"
    reward_funcs = ["tasks.environments.wordle:wordle_win", "...:wordle_partial"]
    row = { secret = "crane" }                   # reset(**row) keywords
    loop = { max_tool_calling_iterations = 6, max_completion_length = 512 }

and without either, the coding environment on the task itself. The reward is born in the
environment: the weighted nansum of the reward functions (default: `env.reward`) is written to
`/logs/agent/env_reward.json`, which the task's verifier forwards (see the built-in env tasks'
`tests/test.sh`). No reward (None) writes no file, so the rollout is unscoreable, never 0.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harnesses._common import LOG_DIR, tail
from harnesses.base import AgentOutcome, AgentRun
from harnesses.env_factory.contract import EnvironmentFactory
from harnesses.env_factory.errors import EpisodeError
from harnesses.env_factory.loop import EpisodeResult, LoopConfig, run_episode
from harnesses.env_factory.rewards import RewardFunc, compute_rewards, env_attribute
from harnesses.errors import HarnessConfigError

if TYPE_CHECKING:
    from sandboxes.base import ImageLayer, Sandbox

DEFAULT_ENVIRONMENT = "tasks.environments.coding:CodingEnv"
METADATA_KEY = "env_factory"
"""`[metadata.env_factory]` in task.toml."""
ENV_REWARD_PATH = f"{LOG_DIR}/env_reward.json"
TRANSCRIPT_PATH = f"{LOG_DIR}/env_factory.json"


class EnvFactorySpec(BaseModel):
    """What to run for one task (from `[metadata.env_factory]` or the harness's constructor)."""

    model_config = ConfigDict(extra="forbid")

    environment: str = DEFAULT_ENVIRONMENT
    """`module:Class` of an environment_factory class."""
    reward_funcs: list[str] = Field(default_factory=list)
    """`module:function` reward functions; empty uses `env.reward`."""
    reward_weights: list[float] | None = None
    row: dict[str, Any] = Field(default_factory=dict)
    """Keywords for `reset(**row)` besides the ones the harness adds (instruction, workdir, sandbox, seed)."""
    loop: LoopConfig = Field(default_factory=LoopConfig)


def load_function(spec: str) -> RewardFunc:
    module_name, _, attr = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise HarnessConfigError(f"reward function {spec!r} cannot be loaded: {exc}") from exc
    if not callable(function):
        raise HarnessConfigError(f"reward function {spec!r} is not callable")
    return function


class EnvFactoryHarness:
    """Runs one white-box episode per rollout on a fresh environment instance."""

    name = "env-factory"
    multi_step_task = False
    """A white-box episode may rightly end after one model call (the model answered without tools)."""

    def __init__(
        self,
        environment: str | type | None = None,
        *,
        reward_funcs: list[RewardFunc] | None = None,
        reward_weights: list[float] | None = None,
        loop: LoopConfig | None = None,
        row: dict[str, Any] | None = None,
    ) -> None:
        self._environment = environment
        self._factory = EnvironmentFactory(environment) if environment is not None else None
        self._reward_funcs = reward_funcs
        self._reward_weights = reward_weights
        self._loop = loop
        self._row = row

    def image_layer(self) -> ImageLayer | None:
        return None

    def _resolve(
        self, run: AgentRun
    ) -> tuple[EnvironmentFactory, list[RewardFunc], list[float] | None, EnvFactorySpec]:
        raw = ((run.extra.get("task_metadata") or {}).get(METADATA_KEY)) or {}
        try:
            spec = EnvFactorySpec.model_validate(raw)
        except ValidationError as exc:
            raise HarnessConfigError(f"task.toml [metadata.{METADATA_KEY}] is invalid: {exc}") from exc
        factory = self._factory or EnvironmentFactory(spec.environment)
        if self._reward_funcs is not None:
            funcs, weights = self._reward_funcs, self._reward_weights
        elif spec.reward_funcs:
            funcs, weights = [load_function(s) for s in spec.reward_funcs], spec.reward_weights
        else:
            funcs, weights = [env_attribute("reward")], None
        if self._loop is not None:
            spec.loop = self._loop
        if self._row is not None:
            spec.row = dict(self._row)
        return factory, funcs, weights, spec

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        try:
            factory, funcs, weights, spec = self._resolve(run)
        except HarnessConfigError as exc:
            return AgentOutcome(error=str(exc))
        row = {
            **spec.row,
            "instruction": run.instruction,
            "workdir": run.workdir,
            "sandbox": sandbox,
            "seed": run.extra.get("seed"),
            "episode_id": run.extra.get("episode_id"),
        }
        env = factory.create()
        try:
            async with asyncio.timeout(run.timeout_s):
                result = await self._episode(factory, env, run, row, spec.loop)
        except TimeoutError:
            return AgentOutcome(
                timed_out=True, log_tail=f"the episode did not end within {run.timeout_s:.0f} s"
            )
        except EpisodeError as exc:
            return AgentOutcome(error=str(exc), log_tail=tail(str(exc)))
        except Exception as exc:  # reset() or the environment itself failed: the harness's failure
            return AgentOutcome(error=f"environment {factory.name} failed: {type(exc).__name__}: {exc}")
        # As TRL calls reward functions: dataset columns, prompts and completions, one entry per sample.
        columns = {k: [v] for k, v in row.items() if k != "sandbox"}
        columns["prompts"] = [result.messages[: result.prompt_messages]]
        columns["completions"] = [result.completion]
        try:
            table = compute_rewards(funcs, [env], weights, **columns)
        except Exception as exc:
            return AgentOutcome(error=f"reward functions failed: {type(exc).__name__}: {exc}")
        total = table.totals()[0]
        if total is not None:
            await sandbox.upload_file(json.dumps({"reward": total, **table.row(0)}).encode(), ENV_REWARD_PATH)
        await sandbox.upload_file(_transcript(factory, result, total), TRANSCRIPT_PATH)
        return AgentOutcome(
            exit_code=0,
            tool_calls_by_name=result.tool_calls_by_name,
            tool_failures=result.tool_failures,
            log_tail=tail(_summary(result, total)),
        )

    async def _episode(
        self, factory: EnvironmentFactory, env: Any, run: AgentRun, row: dict[str, Any], loop: LoopConfig
    ) -> EpisodeResult:
        from openai import AsyncOpenAI

        # The loop runs on the host: a URL the host reaches (the sandbox-side one works for local,
        # docker's bridge gateway and public e2b URLs alike, unless the server says otherwise).
        base_url = run.extra.get("host_base_url") or run.base_url
        client = AsyncOpenAI(base_url=base_url, api_key=run.api_key, max_retries=0, timeout=run.timeout_s)
        try:
            prompt = [{"role": "user", "content": run.instruction}]
            return await run_episode(
                factory, env, client, model=run.model, prompt=prompt, row=row, config=loop
            )
        finally:
            await client.close()


def _summary(result: EpisodeResult, reward: float | None) -> str:
    calls = ", ".join(f"{n}={c}" for n, c in result.tool_calls_by_name.items()) or "none"
    return (
        f"stop: {result.stop_reason}; model calls: {result.model_calls}; completion tokens: "
        f"{result.completion_tokens}; tool calls: {calls}; failures: {result.tool_failures}; env reward: {reward}"
    )


def _transcript(factory: EnvironmentFactory, result: EpisodeResult, reward: float | None) -> bytes:
    body = {"environment": factory.name, "env_reward": reward, **result.model_dump(mode="json")}
    return json.dumps(body, ensure_ascii=False, default=str).encode()
