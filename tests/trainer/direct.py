"""A harness that needs no server: one model call per rollout, straight to the embedded engine.

`DirectSessionFactory` speaks the session-factory contract the trainer drives (`create(task, seed=,
episode_id=)` -> a session with `verify()`, `fetch_training_trace()`, `close()`), as HarborSessionFactory
does, but runs the rollout in-process: it asks the engine's /v1/completions for a completion of the
task's prompt token ids (real sampling, real logprobs, the engine's x-policy-version header) and builds
the TrainingTrace the capture proxy would. The reward is dense: the fraction of sampled tokens that lie
in the task's target set, so a tiny random model can learn it in a few steps.
"""

from __future__ import annotations

from typing import Any

import httpx

from capture_proxy.models import TrainingTrace
from capture_proxy.recording import parse_policy_version
from harbor_server.client import VerifyResult


def target_fraction(completion: list[int], targets: set[int]) -> float | None:
    return sum(t in targets for t in completion) / len(completion) if completion else None


class DirectSession:
    def __init__(self, trace: TrainingTrace, reward: float | None, tool_metrics: dict[str, Any] | None = None):
        self.trace, self.reward = trace, reward
        self.tool_metrics = dict(tool_metrics or {"tool_calls_by_name": {}})
        self.closed = False

    def verify(self) -> VerifyResult:
        return VerifyResult(env_reward=self.reward, metrics={"status": "completed", **self.tool_metrics})

    def fetch_training_trace(self) -> TrainingTrace:
        return self.trace

    def close(self) -> None:
        self.closed = True


class DirectSessionFactory:
    def __init__(
        self,
        engine_url: str,
        *,
        sampling: dict[str, Any] | None = None,
        model: str = "tiny",
        tool_metrics: dict[str, Any] | None = None,
    ) -> None:
        """`tool_metrics`: what every session's verify() reports about tool calls, as the server's
        sessions do (`tool_calls_by_name`, `tool_failures_by_name`, counts)."""
        self.engine_url = engine_url.rstrip("/")
        self.sampling = dict(sampling or {})
        self.model = model
        self.tool_metrics = tool_metrics
        self.http = httpx.Client(timeout=120)
        self.created: list[str] = []

    def create(
        self, task: dict[str, Any], seed: int | None = None, episode_id: str | None = None
    ) -> DirectSession:
        self.created.append(episode_id or "")
        prompt = list(task["prompt_ids"])
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": self.sampling.get("max_tokens", 8),
            "temperature": self.sampling.get("temperature", 1.0), "logprobs": 0, "return_token_ids": True,
            "seed": seed, "ignore_eos": True,
        }  # fmt: skip
        response = self.http.post(f"{self.engine_url}/v1/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        completion = choice["token_ids"]
        trace = TrainingTrace.model_validate({
            "session_id": episode_id or "direct",
            "turns": [{
                "node_id": "n0", "prompt_token_ids": prompt, "completion_token_ids": completion,
                "per_token_logps": choice["logprobs"]["token_logprobs"],
                "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "request": {"prompt": prompt}, "response": {"choices": [{"text": choice["text"]}]},
                "metadata": {"endpoint": "completions", "sampling": body,
                             "policy_version": parse_policy_version(response.headers["x-policy-version"])},
            }],
            "task_id": str(task.get("task_id")),
        })  # fmt: skip
        return DirectSession(trace, target_fraction(completion, set(task["targets"])), self.tool_metrics)

    def close(self) -> None:
        self.http.close()


class AsyncDirectSession(DirectSession):
    async def verify(self) -> VerifyResult:  # type: ignore[override]
        return DirectSession.verify(self)

    async def fetch_training_trace(self) -> TrainingTrace:  # type: ignore[override]
        return self.trace

    async def close(self) -> None:  # type: ignore[override]
        self.closed = True


class AsyncDirectSessionFactory:
    """The async twin, as AsyncHarborSessionFactory is to HarborSessionFactory (coroutine methods)."""

    def __init__(self, engine_url: str, *, sampling: dict[str, Any] | None = None) -> None:
        self.sync = DirectSessionFactory(engine_url, sampling=sampling)

    async def create(self, task: dict[str, Any], seed: int | None = None, episode_id: str | None = None):
        import asyncio

        session = await asyncio.to_thread(self.sync.create, task, seed, episode_id)
        return AsyncDirectSession(session.trace, session.reward)
