"""The harness layer (OpenEnv's design): driving any environment session into one rollout.

    ResourceSessionFactory --create(task, seed, episode_id)--> ResourceSession
        initial_messages() / list_tools() / call_tool(name, args) / verify(messages) / close()
    HarnessAdapter.run_white_box(session, model_step, limits)   we sample every turn (MCPHarnessAdapter)
    HarnessAdapter.run_black_box(session, limits)               a harness owns its loop (CLIHarnessAdapter,
                                                                 which talks MCP to the session through a
                                                                 SessionMCPBridge)
    build_harness_rollout_func(...)                              the same, as a TRL-style rollout function
    EnvironmentSessionFactory(EnvClass)                          environment_factory classes as sessions

The layer is synchronous, as OpenEnv's is: run concurrent rollouts in threads or processes. Rewards
come only from the session (tool results and `verify()`), reconciled by `resolve_env_reward`.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from harnesses.env_factory.contract import RESERVED_TOOL_NAMES, EnvironmentFactory, parse_arguments, to_text
from harnesses.env_factory.loop import initial_messages
from harnesses.errors import HarnessConfigError
from harnesses.rewards import resolve_env_reward

# -- data --------------------------------------------------------------------------------------


class ToolResult(BaseModel):
    """What one tool call did in the environment."""

    content: str = ""
    reward: float | None = None
    """The environment's reward after this step, if it reports one."""
    done: bool = False
    error: str | None = None
    """Why the call failed (the model sees it as the tool message)."""
    metadata: dict[str, Any] = Field(default_factory=dict)


class VerifyResult(BaseModel):
    """End-of-episode summary. `env_reward` must forward the environment's reward, never invent one."""

    env_reward: float | None = None
    done: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)


class ToolTraceEntry(BaseModel):
    turn: int
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: ToolResult
    latency_s: float = 0.0


class ModelStepResult(BaseModel):
    """One sampled turn: the assistant message (OpenAI shape) and, for training, its tokens."""

    message: dict[str, Any]
    prompt_ids: list[int] = Field(default_factory=list)
    completion_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: str | None = None


class HarnessRunLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=10, ge=1)
    """Most model turns of a white-box rollout."""
    max_tool_calls_per_turn: int | None = Field(default=None, ge=1)
    """Calls beyond this in one turn are answered with an error and not run."""
    max_total_tool_calls: int | None = Field(default=None, ge=1)
    """The rollout stops (truncated) when the model asks for more tool calls than this in all."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Passed to every model step (temperature, max_tokens, ...)."""


class HarnessRolloutResult(BaseModel):
    messages: list[dict[str, Any]]
    prompt_ids: list[int] = Field(default_factory=list)
    """The first turn's prompt tokens (white-box only)."""
    completion_ids: list[int] = Field(default_factory=list)
    """Every turn's sampled tokens, concatenated (white-box only)."""
    logprobs: list[float] = Field(default_factory=list)
    tool_trace: list[ToolTraceEntry] = Field(default_factory=list)
    done: bool = False
    verify: VerifyResult | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)


# -- protocols ---------------------------------------------------------------------------------


@runtime_checkable
class ResourceSession(Protocol):
    """One rollout's exclusive environment session."""

    def initial_messages(self) -> list[dict[str, Any]]: ...

    def list_tools(self) -> list[dict[str, Any]]:
        """OpenAI function tools ({"type": "function", "function": {name, description, parameters}})."""
        ...

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    def verify(self, messages: list[dict[str, Any]] | None = None) -> VerifyResult: ...

    def close(self) -> None: ...


@runtime_checkable
class ResourceSessionFactory(Protocol):
    def create(
        self, task: Any, seed: int | None = None, episode_id: str | None = None
    ) -> ResourceSession: ...


class ModelStep(Protocol):
    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sampling: dict[str, Any]
    ) -> ModelStepResult: ...


class HarnessAdapter(ABC):
    """How a rollout is driven: we sample each turn (white box) or a harness runs its own loop (black box)."""

    @abstractmethod
    def run_white_box(
        self, session: ResourceSession, model_step: ModelStep, limits: HarnessRunLimits
    ) -> HarnessRolloutResult: ...

    @abstractmethod
    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits) -> HarnessRolloutResult: ...


def _tool_name(tool: dict[str, Any]) -> str:
    return (tool.get("function") or tool).get("name", "")


def _refuse_reserved(name: str) -> None:
    if name in RESERVED_TOOL_NAMES:
        raise HarnessConfigError(
            f"tool name {name!r} is reserved ({', '.join(sorted(RESERVED_TOOL_NAMES))} drive the episode, "
            "they are not actions the model may call)"
        )


def _timed_call(session: ResourceSession, turn: int, name: str, arguments: dict[str, Any]) -> ToolTraceEntry:
    started = time.perf_counter()
    try:
        _refuse_reserved(name)
        result = session.call_tool(name, arguments)
    except Exception as exc:  # the session's failure is the model's feedback
        result = ToolResult(content=f"Error: {type(exc).__name__}: {exc}", error=str(exc))
    return ToolTraceEntry(
        turn=turn, name=name, arguments=arguments, result=result, latency_s=time.perf_counter() - started
    )


# -- white box ---------------------------------------------------------------------------------


class MCPHarnessAdapter(HarnessAdapter):
    """Drives the loop itself: sample, run the tool calls on the session, repeat; then verify."""

    def run_white_box(
        self, session: ResourceSession, model_step: ModelStep, limits: HarnessRunLimits
    ) -> HarnessRolloutResult:
        messages = [dict(m) for m in session.initial_messages()]
        tools = [t for t in session.list_tools() if _tool_name(t) not in RESERVED_TOOL_NAMES]
        result = HarnessRolloutResult(messages=messages)
        messages = result.messages
        total_calls = 0
        for turn in range(limits.max_turns):
            step = model_step(messages, tools, dict(limits.sampling))
            if not result.prompt_ids:
                result.prompt_ids = list(step.prompt_ids)
            result.completion_ids += step.completion_ids
            result.logprobs += step.logprobs
            messages.append(step.message)
            calls = step.message.get("tool_calls") or []
            if not calls:
                result.done = True
                break
            for index, call in enumerate(calls):
                if limits.max_total_tool_calls is not None and total_calls >= limits.max_total_tool_calls:
                    result.metrics["truncated"] = True
                    return self._finish(session, result)
                function = call.get("function") or {}
                name = function.get("name", "")
                if limits.max_tool_calls_per_turn is not None and index >= limits.max_tool_calls_per_turn:
                    entry = ToolTraceEntry(
                        turn=turn,
                        name=name,
                        result=ToolResult(
                            content="Error: too many tool calls in one turn", error="per-turn limit"
                        ),
                    )
                    result.metrics["skipped_tool_calls"] = result.metrics.get("skipped_tool_calls", 0) + 1
                else:
                    try:
                        arguments = parse_arguments(function.get("arguments"))
                    except Exception as exc:
                        entry = ToolTraceEntry(
                            turn=turn, name=name, result=ToolResult(content=f"Error: {exc}", error=str(exc))
                        )
                    else:
                        entry = _timed_call(session, turn, name, arguments)
                    total_calls += 1
                result.tool_trace.append(entry)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id", ""),
                        "name": name,
                        "content": entry.result.content,
                    }
                )
                if entry.result.done:
                    result.done = True
            if result.done:
                break
        else:
            result.metrics["truncated"] = True  # max_turns reached with the model still calling tools
        return self._finish(session, result)

    @staticmethod
    def _finish(session: ResourceSession, result: HarnessRolloutResult) -> HarnessRolloutResult:
        result.verify = session.verify(result.messages)
        result.metrics.setdefault("truncated", False)
        result.metrics["num_turns"] = sum(1 for m in result.messages if m.get("role") == "assistant")
        result.metrics["tool_calls"] = len(result.tool_trace)
        result.metrics["tool_failures"] = sum(1 for e in result.tool_trace if e.result.error is not None)
        return result

    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits) -> HarnessRolloutResult:
        raise NotImplementedError(
            "MCPHarnessAdapter samples every turn itself (white box); for a harness that owns its loop "
            "use CLIHarnessAdapter(runner).run_black_box"
        )


# -- black box: MCP over a session -------------------------------------------------------------

JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602
MCP_PROTOCOL_VERSION = "2025-06-18"


class SessionMCPBridge:
    """A ResourceSession as an in-process MCP server (JSON-RPC 2.0: initialize, tools/list, tools/call).

    A harness that only speaks MCP can drive the session with no network. Reserved names
    (reset/step/state/close) are neither listed nor callable: the episode protocol is not a tool.
    """

    def __init__(self, session: ResourceSession, *, max_total_tool_calls: int | None = None) -> None:
        self.session = session
        self.max_total_tool_calls = max_total_tool_calls
        self.tool_trace: list[ToolTraceEntry] = []

    def handle_json(self, line: str) -> str | None:
        """One JSON-RPC message in, its reply out (None for notifications)."""
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            return json.dumps(self._error(None, JSONRPC_PARSE_ERROR, f"parse error: {exc.msg}"))
        reply = self.handle(request)
        return None if reply is None else json.dumps(reply)

    def handle(self, request: Any) -> dict[str, Any] | None:
        if (
            not isinstance(request, dict)
            or request.get("jsonrpc") != "2.0"
            or not isinstance(request.get("method"), str)
        ):
            return self._error(None, JSONRPC_INVALID_REQUEST, "expected a JSON-RPC 2.0 request object")
        request_id = request.get("id")
        method, params = request["method"], request.get("params") or {}
        if "id" not in request:  # a notification (e.g. notifications/initialized): no reply
            return None
        if method == "initialize":
            return self._ok(request_id, {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "harbor-session-bridge", "version": "1"},
            })  # fmt: skip
        if method == "ping":
            return self._ok(request_id, {})
        if method == "tools/list":
            return self._ok(request_id, {"tools": self._tools()})
        if method == "tools/call":
            return self._call(request_id, params)
        return self._error(request_id, JSONRPC_METHOD_NOT_FOUND, f"method {method!r} is not supported")

    def _tools(self) -> list[dict[str, Any]]:
        tools = []
        for tool in self.session.list_tools():
            function = tool.get("function") or tool
            if function.get("name") in RESERVED_TOOL_NAMES:
                continue
            schema = (
                function.get("parameters")
                or function.get("inputSchema")
                or {"type": "object", "properties": {}}
            )
            tools.append(
                {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "inputSchema": schema,
                }
            )
        return tools

    def _call(self, request_id: Any, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict) or not isinstance(params.get("name"), str):
            return self._error(request_id, JSONRPC_INVALID_PARAMS, "tools/call needs params.name (a string)")
        name = params["name"]
        if name in RESERVED_TOOL_NAMES:
            return self._error(
                request_id, JSONRPC_INVALID_PARAMS, f"tool {name!r} is reserved and cannot be called"
            )
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            return self._error(
                request_id, JSONRPC_INVALID_PARAMS, "tools/call params.arguments must be an object"
            )
        if self.max_total_tool_calls is not None and len(self.tool_trace) >= self.max_total_tool_calls:
            return self._error(
                request_id,
                JSONRPC_INVALID_PARAMS,
                f"tool-call budget of {self.max_total_tool_calls} is spent",
            )
        entry = _timed_call(self.session, 0, name, arguments)
        self.tool_trace.append(entry)
        result = entry.result
        return self._ok(request_id, {
            "content": [{"type": "text", "text": result.content}],
            "isError": result.error is not None,
            "structuredContent": {"reward": result.reward, "done": result.done},
        })  # fmt: skip

    @staticmethod
    def _ok(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    @staticmethod
    def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


BlackBoxRunner = Callable[
    [SessionMCPBridge, list[dict[str, Any]], HarnessRunLimits], list[dict[str, Any]] | None
]
"""Runs a loop-owning harness against the bridge; returns its final transcript (or None)."""


class CLIHarnessAdapter(HarnessAdapter):
    """Hands a loop-owning harness (a CLI agent, say) a SessionMCPBridge; then verifies the session."""

    def __init__(self, runner: BlackBoxRunner) -> None:
        self.runner = runner

    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits) -> HarnessRolloutResult:
        bridge = SessionMCPBridge(session, max_total_tool_calls=limits.max_total_tool_calls)
        initial = [dict(m) for m in session.initial_messages()]
        messages = self.runner(bridge, initial, limits) or initial
        result = HarnessRolloutResult(messages=messages, tool_trace=bridge.tool_trace)
        result.done = any(entry.result.done for entry in bridge.tool_trace)
        return MCPHarnessAdapter._finish(session, result)

    def run_white_box(
        self, session: ResourceSession, model_step: ModelStep, limits: HarnessRunLimits
    ) -> HarnessRolloutResult:
        raise NotImplementedError(
            "CLIHarnessAdapter runs a harness that owns its loop (black box), so it cannot sample turns; "
            "use MCPHarnessAdapter().run_white_box"
        )


# -- wrapping reset/step clients ----------------------------------------------------------------


def _field(value: Any, name: str, default: Any = None) -> Any:
    return value.get(name, default) if isinstance(value, dict) else getattr(value, name, default)


class StepEnvSessionAdapter:
    """Any reset/step(/state) client as a ResourceSession.

    `action_builder(name, arguments)` turns a tool call into the client's action; `step()` results are
    read as `.observation`, `.reward`, `.done` (attributes or keys). A client with `.sync()` (OpenEnv's
    async clients) is converted first, because this layer is synchronous.
    """

    def __init__(
        self,
        client: Any,
        *,
        tools: Sequence[dict[str, Any]],
        action_builder: Callable[[str, dict[str, Any]], Any],
        format_observation: Callable[[Any], str] = to_text,
        reset_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if callable(getattr(client, "sync", None)):
            client = client.sync()
        for tool in tools:
            _refuse_reserved(_tool_name(tool))
        self.client = client
        self.tools = [dict(t) for t in tools]
        self.action_builder = action_builder
        self.format_observation = format_observation
        self.reset_kwargs = dict(reset_kwargs or {})
        self.last_reward: float | None = None
        self.done = False
        self.steps = 0

    def initial_messages(self) -> list[dict[str, Any]]:
        result = self.client.reset(**self.reset_kwargs)
        observation = _field(result, "observation", result)
        return [{"role": "user", "content": self.format_observation(observation)}]

    def list_tools(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.tools]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name not in {_tool_name(t) for t in self.tools}:
            return ToolResult(content=f"Error: unknown tool {name!r}", error=f"unknown tool {name!r}")
        result = self.client.step(self.action_builder(name, arguments))
        self.steps += 1
        reward = _field(result, "reward")
        self.done = bool(_field(result, "done", False))
        if reward is not None:
            self.last_reward = float(reward)
        metadata: dict[str, Any] = {}
        state = getattr(self.client, "state", None)
        if callable(state):
            metadata["state"] = state()
        return ToolResult(
            content=self.format_observation(_field(result, "observation", result)),
            reward=None if reward is None else float(reward),
            done=self.done,
            metadata=metadata,
        )

    def verify(self, messages: list[dict[str, Any]] | None = None) -> VerifyResult:
        # Forwards the environment's own last reward: never a new one.
        return VerifyResult(env_reward=self.last_reward, done=self.done, metrics={"steps": self.steps})

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if callable(close):
            close()


# -- environment_factory classes as sessions ------------------------------------------------------


class EnvironmentSession:
    """One instance of an environment_factory class as a ResourceSession.

    The env's `reward` attribute (after each call) is the tool results' reward and what `verify()`
    forwards, so resolve_env_reward's cross-check holds by construction; `done` ends the rollout.
    Async tools run on a private event loop, since this layer is synchronous.
    """

    def __init__(
        self,
        factory: EnvironmentFactory,
        row: dict[str, Any],
        prompt: str | list[dict[str, Any]],
        reward_attribute: str = "reward",
    ) -> None:
        self.factory = factory
        self.prompt = prompt
        self.reward_attribute = reward_attribute
        self._runner = asyncio.Runner()
        self.env = factory.create()
        try:
            self._observation = self._runner.run(factory.reset(self.env, row))
        except BaseException:
            self._runner.close()
            raise

    def _reward(self) -> float | None:
        reward = getattr(self.env, self.reward_attribute, None)
        return None if reward is None else float(reward)

    def _done(self) -> bool:
        return getattr(self.env, "done", False) is True

    def initial_messages(self) -> list[dict[str, Any]]:
        return initial_messages(self.prompt, self._observation)

    def list_tools(self) -> list[dict[str, Any]]:
        return self.factory.tool_schemas

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            content = self._runner.run(self.factory.call_tool(self.env, name, arguments))
        except Exception as exc:  # the environment's refusal is the model's feedback (TRL's rule)
            text = f"Error: {type(exc).__name__}: {exc}"
            return ToolResult(content=text, error=str(exc), reward=self._reward(), done=self._done())
        return ToolResult(content=content, reward=self._reward(), done=self._done())

    def verify(self, messages: list[dict[str, Any]] | None = None) -> VerifyResult:
        return VerifyResult(env_reward=self._reward(), done=self._done())

    def close(self) -> None:
        self._runner.close()


class EnvironmentSessionFactory:
    """`create(task)` -> EnvironmentSession, where `task` is a dataset row (its `prompt` column is the
    prompt, every column goes to `reset(**row)`) or a bare prompt string."""

    def __init__(self, environment: str | type, *, reward_attribute: str = "reward") -> None:
        self.factory = EnvironmentFactory(environment)
        self.reward_attribute = reward_attribute

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> EnvironmentSession:
        row = dict(task) if isinstance(task, dict) else {"prompt": task}
        row.setdefault("seed", seed)
        row.setdefault("episode_id", episode_id)
        return EnvironmentSession(self.factory, row, row.get("prompt") or "", self.reward_attribute)


# -- TRL-style rollout function -------------------------------------------------------------------


def build_harness_rollout_func(
    session_factory: ResourceSessionFactory,
    harness_adapter: HarnessAdapter,
    model_step_builder: Callable[[Any], ModelStep],
    limits: HarnessRunLimits | None = None,
    reward_key: str = "env_reward",
) -> Callable[[Sequence[Any], Any], dict[str, list[Any]]]:
    """A `(prompts, trainer) -> dict` rollout function: one session per prompt, always closed.

    The dict holds `prompt_ids`, `completion_ids`, `logprobs`, `<reward_key>` (resolve_env_reward:
    a rollout without a reward is an error, never 0) and `verify_metrics`, one entry per prompt.
    """
    limits = limits or HarnessRunLimits()

    def rollout_func(prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        model_step = model_step_builder(trainer)
        seed = getattr(getattr(trainer, "args", None), "seed", None)
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            reward_key: [],
            "verify_metrics": [],
        }
        for index, prompt in enumerate(prompts):
            session = session_factory.create(prompt, seed=seed, episode_id=f"rollout-{index:06d}")
            try:
                result = harness_adapter.run_white_box(session, model_step, limits)
                reward = resolve_env_reward(result.tool_trace, result.verify)
            finally:
                session.close()
            out["prompt_ids"].append(result.prompt_ids)
            out["completion_ids"].append(result.completion_ids)
            out["logprobs"].append(result.logprobs)
            out[reward_key].append(reward)
            out["verify_metrics"].append(dict(result.verify.metrics) if result.verify else {})
        return out

    return rollout_func


# -- a model step for any OpenAI-compatible endpoint (e.g. a capture proxy session) ----------------


def openai_model_step(client: Any, model: str) -> ModelStep:
    """A ModelStep over `openai.OpenAI` that asks vLLM (through the proxy) for its token ids and logprobs."""

    def step(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]], sampling: dict[str, Any]
    ) -> ModelStepResult:
        response = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=tools or None,
            logprobs=True,
            extra_body={"return_token_ids": True},
            **sampling,
        )
        choice = response.choices[0]
        message: dict[str, Any] = {"role": "assistant", "content": choice.message.content or ""}
        if choice.message.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in choice.message.tool_calls
            ]
        logprobs = [t.logprob for t in (choice.logprobs.content or [])] if choice.logprobs else []
        return ModelStepResult(
            message=message,
            prompt_ids=list(getattr(response, "prompt_token_ids", None) or []),
            completion_ids=list(getattr(choice, "token_ids", None) or []),
            logprobs=logprobs,
            finish_reason=choice.finish_reason,
        )

    return step
