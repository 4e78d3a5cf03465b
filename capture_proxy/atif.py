"""A rollout's captured turns as an ATIF trajectory: Harbor's Agent Trajectory Interchange Format
(`ATIF-v1.8`, harbor 0.26.0 `harbor/models/trajectories/`), the `agent/trajectory.json` of a Harbor
trial folder that `harbor view` and Harbor's validator read.

Built from what the proxy recorded, not from an agent's own log, so every harness gets one:
- the first call's request messages open it: system (and developer) messages are `system` steps, user
  messages `user` steps, assistant messages the agent brought along `agent` steps marked
  `is_copied_context`, tool messages the observation of the agent step before them;
- every model call is one `agent` step: the answer's text, reasoning and tool calls, and `metrics` with
  the engine's own prompt and completion token ids and sampled logprobs (none where the engine gave none);
- its observation holds its tool calls' results, found by `tool_call_id` in the later requests, and the
  user messages (text-mode observations) that the next call of the same conversation appended.

The models below are the subset of Harbor's that these trajectories use, with Harbor's field names and
`extra="forbid"`; Harbor's own package is the judge (tests/harbor_ref/validate_job.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from capture_proxy.models import TrainingTurn

SCHEMA_VERSION = "ATIF-v1.8"
StepSource = Literal["system", "user", "agent"]
_SOURCES: dict[str, StepSource] = {"system": "system", "developer": "system", "user": "user"}


class _Atif(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolCall(_Atif):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]


class ObservationResult(_Atif):
    source_call_id: str | None = None
    """The `tool_call_id` this result answers; None for a text observation (a user message)."""
    content: str | None = None


class Observation(_Atif):
    results: list[ObservationResult]


class Metrics(_Atif):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """The engine's sampled logprob of each completion token."""


class Step(_Atif):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: StepSource
    model_name: str | None = None
    message: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    is_copied_context: bool | None = None
    llm_call_count: int | None = None
    extra: dict[str, Any] | None = None


class Agent(_Atif):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None


class FinalMetrics(_Atif):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_steps: int | None = None


class Trajectory(_Atif):
    schema_version: Literal["ATIF-v1.8"] = SCHEMA_VERSION
    session_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    extra: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """Indented JSON without the unset (None) fields, as Harbor writes its trajectories."""
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True), option=orjson.OPT_INDENT_2)


def trajectory_from_turns(
    turns: Sequence[TrainingTurn], agent: Agent, *, session_id: str | None = None
) -> Trajectory | None:
    """The ATIF trajectory of one rollout's turns, in call order; None when it made no model call."""
    if not turns:
        return None
    steps: list[Step] = []
    for message in _request_messages(turns[0]):
        _history_step(steps, message)
    for i, turn in enumerate(turns):
        step = _agent_step(len(steps) + 1, turn)
        results = _observations(turn, turns[i + 1 :], step.tool_calls or [])
        if results:
            step.observation = Observation(results=results)
        steps.append(step)
    tools = _request(turns[0]).get("tools")
    agent = agent.model_copy(update={"tool_definitions": list(tools) if tools else None})
    metrics = [s.metrics for s in steps if s.metrics is not None]
    return Trajectory(
        session_id=session_id,
        agent=agent,
        steps=steps,
        notes="Built by harbor-rl from the capture proxy's record of every model call",
        final_metrics=FinalMetrics(
            total_prompt_tokens=sum(m.prompt_tokens or 0 for m in metrics),
            total_completion_tokens=sum(m.completion_tokens or 0 for m in metrics),
            total_cached_tokens=sum(m.cached_tokens for m in metrics if m.cached_tokens) or None,
            total_steps=len(steps),
        ),
    )


def _request(turn: TrainingTurn) -> dict[str, Any]:
    return turn.request if isinstance(turn.request, dict) else {}


def _request_messages(turn: TrainingTurn) -> list[dict[str, Any]]:
    """The chat messages a call sent; a completions call's prompt reads as one user message."""
    request = _request(turn)
    if "messages" in request:
        return [m for m in request.get("messages") or [] if isinstance(m, dict)]
    prompt = request.get("prompt")
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else []


def _text(content: Any) -> str:
    """A message's content as text: text parts joined, other parts named (images are not copied)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(part.get("text") if part.get("type") == "text" else f"[{part.get('type')}]")
            else:
                parts.append(str(part))
        return "".join(p for p in parts if p)
    return str(content)


def _history_step(steps: list[Step], message: dict[str, Any]) -> None:
    role = message.get("role")
    step_id = len(steps) + 1
    if role in _SOURCES:
        steps.append(Step(step_id=step_id, source=_SOURCES[role], message=_text(message.get("content"))))
    elif role == "assistant":
        calls = _tool_calls(message, step_id)
        steps.append(
            Step(
                step_id=step_id,
                source="agent",
                message=_text(message.get("content")),
                tool_calls=calls or None,
                is_copied_context=True,
            )
        )
    elif role == "tool" and steps and steps[-1].source == "agent":
        ids = {c.tool_call_id for c in steps[-1].tool_calls or []}
        call_id = message.get("tool_call_id")
        result = ObservationResult(
            source_call_id=call_id if call_id in ids else None, content=_text(message.get("content"))
        )
        previous = steps[-1].observation.results if steps[-1].observation else []
        steps[-1].observation = Observation(results=[*previous, result])


def _tool_calls(message: dict[str, Any], step_id: int) -> list[ToolCall]:
    calls = []
    for n, call in enumerate(message.get("tool_calls") or [], start=1):
        function = call.get("function") or {}
        calls.append(
            ToolCall(
                tool_call_id=call.get("id") or f"call_{step_id}_{n}",
                function_name=function.get("name") or "unknown",
                arguments=_arguments(function.get("arguments")),
            )
        )
    return calls


def _arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as the object ATIF wants; text that is no JSON object is kept under `raw`."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return {"raw": raw}


def _answer(turn: TrainingTurn) -> dict[str, Any]:
    """The first choice's message (chat) or text (completions) as a message dict."""
    choices = turn.response.get("choices") or [] if isinstance(turn.response, dict) else []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    if isinstance(choice.get("message"), dict):
        return choice["message"]
    return {"role": "assistant", "content": choice.get("text") or ""}


def _agent_step(step_id: int, turn: TrainingTurn) -> Step:
    answer = _answer(turn)
    meta = turn.metadata
    extra = {"node_id": turn.node_id, "turn_role": meta.role, "capture": meta.capture}
    if meta.finish_reason is not None:
        extra["finish_reason"] = meta.finish_reason
    model = turn.response.get("model") if isinstance(turn.response, dict) else None
    return Step(
        step_id=step_id,
        timestamp=datetime.fromtimestamp(meta.created_at, UTC).isoformat() if meta.created_at else None,
        source="agent",
        model_name=model if isinstance(model, str) else None,
        message=_text(answer.get("content")),
        reasoning_content=answer.get("reasoning_content") or answer.get("reasoning") or None,
        tool_calls=_tool_calls(answer, step_id) or None,
        metrics=_metrics(turn),
        llm_call_count=1,
        extra=extra,
    )


def _metrics(turn: TrainingTurn) -> Metrics:
    usage = (turn.response.get("usage") if isinstance(turn.response, dict) else None) or {}
    details = usage.get("prompt_tokens_details") or {}
    return Metrics(
        prompt_tokens=usage.get("prompt_tokens") or len(turn.prompt_token_ids) or None,
        completion_tokens=usage.get("completion_tokens") or len(turn.completion_token_ids) or None,
        cached_tokens=details.get("cached_tokens") or None,
        prompt_token_ids=list(turn.prompt_token_ids) or None,
        completion_token_ids=list(turn.completion_token_ids) or None,
        logprobs=list(turn.per_token_logps) or None,
    )


def _observations(
    turn: TrainingTurn, later: Sequence[TrainingTurn], calls: list[ToolCall]
) -> list[ObservationResult]:
    """What the agent saw after this call: the results of its tool calls and appended user messages."""
    ids = [c.tool_call_id for c in calls]
    results: list[ObservationResult] = []
    answered: set[str] = set()
    for message in _appended(turn, later):
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and call_id in ids and call_id not in answered:
            answered.add(call_id)
            results.append(ObservationResult(source_call_id=call_id, content=_text(message.get("content"))))
        elif message.get("role") == "user":
            results.append(ObservationResult(content=_text(message.get("content"))))
    # A harness that rewrote its history (or interleaved other calls) still sent each result once.
    for call_id in ids:
        if call_id not in answered and (content := _tool_result(call_id, later)) is not None:
            results.append(ObservationResult(source_call_id=call_id, content=content))
    return results


def _appended(turn: TrainingTurn, later: Sequence[TrainingTurn]) -> list[dict[str, Any]]:
    """The messages the next call of the same conversation added after this call's answer: its
    request starts with this call's messages (same roles) and then an assistant message."""
    sent = _request_messages(turn)
    for other in later:
        messages = _request_messages(other)
        if (
            len(messages) > len(sent)
            and [m.get("role") for m in messages[: len(sent)]] == [m.get("role") for m in sent]
            and messages[len(sent)].get("role") == "assistant"
        ):
            return messages[len(sent) + 1 :]
    return []


def _tool_result(call_id: str, later: Sequence[TrainingTurn]) -> str | None:
    for other in later:
        for message in _request_messages(other):
            if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
                return _text(message.get("content"))
    return None
