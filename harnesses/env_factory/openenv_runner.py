"""OpenEnv session factories driven by OpenEnv's own `MCPHarnessAdapter`, the model behind an OpenAI URL.

    step = ChatCompletionsModelStep(openai.OpenAI(base_url=capture_session_url, api_key=key), "tiny")
    episode = run_session_episode(factory, task, seed=7, episode_id="g0-0", model_step=step,
                                  limits=HarnessRunLimits(max_turns=6))
    episode.verify.env_reward                          # what the session's verify() says, None: unscored

`ChatCompletionsModelStep` is an OpenEnv `ModelStep` (openenv/core/harness/rollout.py, openenv 0.10.0)
over any OpenAI-compatible endpoint; pointed at a capture-proxy session, every call is captured like a
black-box agent's (token ids, logprobs, masks). It is ours rather than OpenEnv's
`collect.build_model_step(OpenAIClient(...))` because a rollout needs what that one does not do: no
retries (a retry is a second captured call), each call bounded by the rollout's deadline and
cancellable, the sampling passed through unfiltered, the client closed, the engine's token ids and
logprobs returned in `ModelStepResult`, and a failed call named as such. The tool loop itself is
OpenEnv's: `MCPHarnessAdapter.run_white_box`, then `session.verify()` and `session.close()`, as
`build_harness_rollout_func` does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from harnesses.env_factory.contract import load_attribute
from harnesses.env_factory.errors import EnvironmentLoadError, EpisodeError, OpenEnvMissingError

try:
    from openenv.core.env_server.mcp_types import Tool as MCPTool
    from openenv.core.harness import (
        HarnessAdapter,
        HarnessRolloutResult,
        HarnessRunLimits,
        MCPHarnessAdapter,
        ModelStep,
        ModelStepResult,
        ResourceSessionFactory,
        VerifyResult,
    )
    from openenv.core.llm_client import LLMResponse, ToolCall
except ImportError as exc:  # the `openenv` extra is not installed
    raise OpenEnvMissingError("an OpenEnv session factory", exc) from exc

if TYPE_CHECKING:
    import openai


def openai_tools(tools: list[MCPTool]) -> list[dict[str, Any]]:
    """MCP tools as OpenAI function tools (the request's `tools`)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in tools
    ]


# openenv/core/harness/rollout.py (openenv 0.10.0): the ModelStep protocol and ModelStepResult; the
# reply is OpenEnv's llm_client.py LLMResponse/ToolCall, which MCPHarnessAdapter turns into messages.
class ChatCompletionsModelStep:
    """An OpenEnv `ModelStep`: one chat completion with the session's tools per call.

    `sampling` (OpenEnv's `HarnessRunLimits.sampling`) goes into the request body as it is, with
    `extra_body`; `deadline` (a `time.monotonic()` value) bounds every call, and `cancel()` makes the
    next call raise, so a rollout that timed out stops at its next model call.
    """

    def __init__(
        self,
        client: openai.OpenAI,
        model: str,
        *,
        extra_body: Mapping[str, Any] | None = None,
        deadline: float | None = None,
        token_ids: bool = True,
    ) -> None:
        self.client = client
        self.model = model
        self.extra_body = dict(extra_body or {})
        self.deadline = deadline
        self.token_ids = token_ids
        """Ask for the engine's token ids and logprobs (vLLM's fields) to fill `ModelStepResult`."""
        self.calls = 0
        self.completion_tokens = 0
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[MCPTool], sampling: dict[str, Any]
    ) -> ModelStepResult:
        import openai

        self.calls += 1
        n = self.calls
        if self._cancelled.is_set():
            raise EpisodeError(f"model call {n} not made: the rollout was cancelled")
        timeout = None
        if self.deadline is not None:
            timeout = self.deadline - time.monotonic()
            if timeout <= 0:
                raise EpisodeError(f"model call {n} not made: the rollout's time is up")
        body = {**sampling, **self.extra_body}
        if self.token_ids:
            body.setdefault("return_token_ids", True)
            body.setdefault("logprobs", True)
        request: dict[str, Any] = {"model": self.model, "messages": messages, "extra_body": body}
        if tools:
            request["tools"] = openai_tools(tools)
        if timeout is not None:
            request["timeout"] = timeout
        try:
            response = self.client.chat.completions.create(**request)
        except openai.APIError as exc:
            raise EpisodeError(f"model call {n} failed: {exc}") from exc
        if not response.choices:
            raise EpisodeError(f"model call {n} returned no choices")
        if response.usage is not None:
            self.completion_tokens += response.usage.completion_tokens
        choice = response.choices[0]
        message = choice.message
        calls = [
            ToolCall(id=c.id, name=c.function.name, args=_arguments(n, c.function.name, c.function.arguments))
            for c in message.tool_calls or ()
        ]
        logprobs = [t.logprob for t in (choice.logprobs.content or ())] if choice.logprobs else []
        return ModelStepResult(
            response=LLMResponse(content=message.content or "", tool_calls=calls),
            prompt_ids=list(getattr(response, "prompt_token_ids", None) or []),
            completion_ids=list(getattr(choice, "token_ids", None) or []),
            logprobs=logprobs,
        )


def _arguments(n: int, name: str, text: str | None) -> dict[str, Any]:
    # OpenEnv's ToolCall holds arguments as a dict (its OpenAIClient json.loads them too), so text that
    # is not a JSON object cannot be handed on; vLLM's tool parsers never produce such a call.
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EpisodeError(
            f"model call {n}: the arguments of tool call {name!r} are not JSON ({exc.msg}): {text[:200]!r}"
        ) from None
    if not isinstance(parsed, dict):
        raise EpisodeError(
            f"model call {n}: the arguments of tool call {name!r} are a {type(parsed).__name__}, "
            "not a JSON object"
        )
    return parsed


def load_session_factory(spec: str | type | ResourceSessionFactory) -> ResourceSessionFactory:
    """The factory `spec` names: `module:attr` of a `ResourceSessionFactory` subclass (made with no
    arguments) or instance, or the class or instance itself."""
    target = load_attribute(spec, what="session_factory") if isinstance(spec, str) else spec
    if isinstance(target, type) and issubclass(target, ResourceSessionFactory):
        try:
            return target()
        except TypeError as exc:
            raise EnvironmentLoadError(
                f"session_factory {spec!r}: {target.__qualname__}() cannot be made without arguments "
                f"({exc}); name a module-level instance instead ('module:my_factory')"
            ) from exc
    if isinstance(target, ResourceSessionFactory):
        return target
    if isinstance(target, type):
        raise EnvironmentLoadError(
            f"session_factory {spec!r} is the class {target.__qualname__}, not a subclass of OpenEnv's "
            "ResourceSessionFactory (openenv.core.harness); a TRL-style class goes in environment = ..."
        )
    raise EnvironmentLoadError(
        f"session_factory {spec!r} is a {type(target).__name__}, not an OpenEnv ResourceSessionFactory "
        "(openenv.core.harness.ResourceSessionFactory, a subclass or an instance)"
    )


def run_limits(limits: HarnessRunLimits | Mapping[str, Any] | None) -> HarnessRunLimits:
    """OpenEnv's `HarnessRunLimits` from itself or its fields (task.toml's `limits`)."""
    if limits is None:
        return HarnessRunLimits()
    if isinstance(limits, HarnessRunLimits):
        return limits
    known = set(HarnessRunLimits.__dataclass_fields__)
    unknown = sorted(set(limits) - known)
    if unknown:
        raise EnvironmentLoadError(
            f"limits has unknown keys {unknown}; OpenEnv's HarnessRunLimits takes {sorted(known)}"
        )
    return HarnessRunLimits(**dict(limits))


@dataclass
class SessionEpisode:
    rollout: HarnessRolloutResult
    verify: VerifyResult


def final_state(rollout: HarnessRolloutResult) -> dict[str, Any]:
    """The rollout summary `verify(final_state=...)` gets, in the shape OpenEnv's own callers pass it
    (rollout.py `build_harness_rollout_func`, collect.py `_rollout_final_state`, openenv 0.10.0)."""
    return {
        "done": rollout.done,
        "metrics": dict(rollout.metrics),
        "events": [asdict(event) for event in rollout.events],
        "tool_trace": [asdict(entry) for entry in rollout.tool_trace],
    }


def run_session_episode(
    factory: ResourceSessionFactory,
    task: Any,
    *,
    model_step: ModelStep,
    seed: int | None = None,
    episode_id: str | None = None,
    limits: HarnessRunLimits | None = None,
    adapter: HarnessAdapter | None = None,
) -> SessionEpisode:
    """One white-box episode: create a session, run OpenEnv's adapter on it, verify, close. Blocking
    (OpenEnv's API is synchronous): call it from a worker thread inside async code."""
    # rollout.py (openenv 0.10.0): build_harness_rollout_func's order, create -> run_white_box ->
    # verify(transcript, final_state) -> close, for one task with its seed and episode id.
    session = factory.create(task=task, seed=seed, episode_id=episode_id)
    try:
        rollout = (adapter or MCPHarnessAdapter()).run_white_box(model_step, session, limits)
        verify = session.verify(transcript=rollout.messages, final_state=final_state(rollout))
    finally:
        session.close()
    if not isinstance(verify, VerifyResult):
        raise EpisodeError(
            f"{type(session).__qualname__}.verify() returned {type(verify).__name__}, not a VerifyResult"
        )
    return SessionEpisode(rollout=rollout, verify=verify)


__all__ = [
    "ChatCompletionsModelStep",
    "SessionEpisode",
    "final_state",
    "load_session_factory",
    "openai_tools",
    "run_limits",
    "run_session_episode",
]
