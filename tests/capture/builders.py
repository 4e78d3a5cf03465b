"""Hand-built rollouts for the capture tests: raw JSON-shaped turns, as the proxy stores them."""

from __future__ import annotations

import copy
from typing import Any

from capture_proxy.models import TrainingTrace, TrainingTurn

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
SYSTEM_IDS = [1, 2, 3]


def turn(
    node_id: str,
    prompt: list[int],
    completion: list[int],
    *,
    mask: list[int] | None = None,
    logps: list[float] | None = None,
    tools: bool = True,
    messages: list[dict[str, Any]] | None = None,
    policy_version: int | None = 0,
    **metadata: Any,
) -> dict[str, Any]:
    """A raw turn; by default every sampled token is trained and has logprob -0.5."""
    request: dict[str, Any] = {"model": "m", "messages": messages or [{"role": "user", "content": node_id}]}
    if tools:
        request["tools"] = TOOLS
    reply = {"role": "assistant", "content": _text(completion), "tool_calls": None, "refusal": None}
    return {
        "node_id": node_id,
        "prompt_token_ids": list(prompt),
        "completion_token_ids": list(completion),
        "per_token_logps": [-0.5] * len(completion) if logps is None else logps,
        "loss_mask": [0] * len(prompt) + [1] * len(completion) if mask is None else mask,
        "request": request,
        "response": {
            "id": f"chatcmpl-{node_id}",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        },
        "metadata": {"policy_version": policy_version, "finish_reason": "stop", **metadata},
    }


class Rollout:
    """An agent conversation that grows the way a harness grows it: each call's prompt is the previous
    call's prompt + completion + the tool output appended after it."""

    def __init__(self, system: list[int] | None = None):
        self.tokens = list(SYSTEM_IDS if system is None else system)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
        ]
        self.turns: list[dict[str, Any]] = []

    def call(self, node_id: str, completion: list[int], **kwargs: Any) -> dict[str, Any]:
        t = turn(node_id, self.tokens, completion, messages=copy.deepcopy(self.messages), **kwargs)
        self.turns.append(t)
        self.tokens = self.tokens + list(completion)
        self.messages.append({"role": "assistant", "content": _text(completion)})
        return t

    def tool(self, ids: list[int]) -> Rollout:
        self.tokens = self.tokens + list(ids)
        self.messages.append({"role": "tool", "tool_call_id": "c", "content": _text(ids)})
        return self

    def fork(self) -> Rollout:
        """A copy of the conversation so far (for retries and branches); turns are shared, not copied."""
        other = Rollout(self.tokens)
        other.messages = copy.deepcopy(self.messages)
        other.turns = self.turns
        return other


def trace(turns: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session_id": "sess-1", "purpose": "train", "turns": turns, **fields}


def models(turns: list[dict[str, Any]]) -> list[TrainingTurn]:
    return [TrainingTurn.model_validate(t) for t in turns]


def trace_model(turns: list[dict[str, Any]], **fields: Any) -> TrainingTrace:
    return TrainingTrace.model_validate(trace(turns, **fields))


def _text(ids: list[int]) -> str:
    return " ".join(map(str, ids))
