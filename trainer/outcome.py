"""`HarnessRolloutOutcome`: what `rollout_reward_fn` sees of one finished rollout (docs/design.md 3.9).

Its fields are TRL's (`trl/experimental/async_grpo/openenv_harness.py`, trl 1.16.0), so a reward function
written for TRL's trainer runs here unchanged: `trace` is the list of TraceEntry records and
`completion` the final message list. Ours carries more: the validated `training_trace`, the status and
the error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capture_proxy.models import TrainingTrace


@dataclass(frozen=True)
class HarnessRolloutOutcome:
    env_reward: float | None
    """The verifier's reward; None means unscoreable (never read it as 0)."""
    completion: list[dict[str, Any]]
    """The final message transcript: the last model call's messages plus its reply."""
    trace: list[dict[str, Any]]
    """TRL's TraceEntry records, one per captured turn (`request`, `response`, token ids, logprobs,
    `loss_mask`, `metadata` with `node_id`): `training_trace.to_trace_entries()`."""
    training_trace: TrainingTrace
    """The validated capture, every turn included (masked-out ones too)."""
    tool_call_count: int = 0
    tool_failure_count: int = 0
    tool_calls_by_name: dict[str, int] = field(default_factory=dict)
    tool_failures_by_name: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    status: str = "completed"
    """The rollout's terminal status: completed, failed, timed_out or cancelled."""
    error: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    """Every number the verifier reported (its reward.json), e.g. each reward function's score of an
    env-factory rollout; logged as `rewards/<name>/mean` beside the rollout's reward."""

    @classmethod
    def from_verify(cls, env_reward: float | None, metrics: Mapping[str, Any], trace: TrainingTrace):
        """From a session's `verify()` (VerifyResult.env_reward, .metrics) and its training trace."""
        by_name = _counts(metrics.get("tool_calls_by_name"))
        return cls(
            env_reward=env_reward,
            completion=final_transcript(trace),
            trace=trace.to_trace_entries(),
            training_trace=trace,
            tool_call_count=int(metrics.get("tool_call_count", sum(by_name.values())) or 0),
            tool_failure_count=int(metrics.get("tool_failure_count", 0) or 0),
            tool_calls_by_name=by_name,
            tool_failures_by_name=_counts(metrics.get("tool_failures_by_name")),
            timed_out=bool(metrics.get("timed_out", False)),
            status=str(metrics.get("status") or "completed"),
            error=metrics.get("error"),
            rewards={str(k): float(v) for k, v in dict(metrics.get("rewards") or {}).items()},
        )

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_token_ids) for t in self.training_trace.turns)


def _counts(raw: Any) -> dict[str, int]:
    return {str(k): int(v) for k, v in dict(raw or {}).items()}


def final_transcript(trace: TrainingTrace) -> list[dict[str, Any]]:
    """The last call's chat messages (or its prompt text) followed by the message it got back."""
    if not trace.turns:
        return []
    last = trace.turns[-1]
    messages = list(last.request.get("messages") or [])
    if not messages and isinstance(last.request.get("prompt"), str):
        messages = [{"role": "user", "content": last.request["prompt"]}]
    choices = last.response.get("choices") or []
    if choices:
        choice = choices[0]
        reply = choice.get("message") or {"role": "assistant", "content": choice.get("text", "")}
        messages.append(reply)
    return messages
