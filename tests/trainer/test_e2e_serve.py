"""End to end: HarnessAsyncGRPOTrainer drives `harbor serve` (HTTP API, capture proxy, SQLite store,
local sandbox, the env-factory harness on the built-in echo environment) against the real embedded
engine, pushing weights over gloo after every step. The engine's policy version goes up with the steps,
and traces sampled after a push carry the new version (the proxy records the engine's
x-policy-version header on every turn)."""

from __future__ import annotations

import functools

import httpx
import pytest

from harbor_server import HarborSessionFactory
from harbor_server.config import ServeConfig
from harbor_server.embedded import free_port, running_server
from trainer.config import AsyncGRPOConfig
from trainer.errors import TrainerConfigError
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.outcome import HarnessRolloutOutcome


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))
    config = ServeConfig(
        datasets=["env-tasks"], model="tiny", port=free_port(), capture_port=free_port(),
        capture_host="127.0.0.1", sandbox="local", store_url=f"sqlite:///{tmp_path}/traces.db",
        check_engine=False, max_concurrent_envs=5,
    )  # fmt: skip
    with running_server(config) as thread:
        yield thread


@pytest.mark.slow
def test_trainer_through_harbor_serve_with_gloo_weight_sync(
    server, fresh_engine, tiny_model, tmp_path
) -> None:
    seen_versions: list[list[int | None]] = []

    def longer_is_better(outcome: HarnessRolloutOutcome) -> float | None:
        """The echo verifier gives a tiny random model 0 every time; reward length, to get a spread."""
        seen_versions.append([t.metadata.policy_version for t in outcome.training_trace.turns])
        return outcome.completion_tokens / 16

    factory = functools.partial(
        HarborSessionFactory, server.url, split="env-tasks", harness="env-factory", sandbox="local",
        llm_url=fresh_engine.v1, model="tiny", agent_timeout_sec=120,
    )  # fmt: skip
    rows = list(HarborSessionFactory(server.url, split="env-tasks", harness="env-factory").prompt_rows())
    rows = [r for r in rows if r["task_id"].startswith("echo")]
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path / "run"), report_to="jsonl", max_steps=3, num_generations=2,
        per_device_train_batch_size=4, max_concurrent_rollouts=4, max_completion_length=16, learning_rate=1e-3,
        max_staleness=1, vllm_server_base_url=fresh_engine.url, weight_sync_backend="gloo",
    )  # fmt: skip
    trainer = HarnessAsyncGRPOTrainer(tiny_model[0], factory, config, train_dataset=rows,
                                      rollout_reward_fn=longer_is_better)  # fmt: skip
    history = trainer.train()

    assert [h["policy_version"] for h in history] == [2, 3, 4]  # the initial push made it 1
    assert httpx.get(f"{fresh_engine.url}/weight_info").json() == {"weight_version": "4"}  # vLLM: a str tag
    versions = [v for trace in seen_versions for v in trace]
    assert None not in versions and set(versions) <= {1, 2, 3, 4}
    assert max(versions) >= 2, f"no trace sampled after a push: {seen_versions}"
    assert all(h["staleness"] <= 1 for h in history)
    assert "rollout/correctness_mean" in history[0] and history[0]["rewards/harness_reward/mean"] >= 0
    assert all(h["rollout/failed"] == 0 for h in history)


@pytest.mark.parametrize("capacity_wait_s", [0.0, 30.0])
def test_a_server_too_small_for_the_rollouts_is_caught_at_start_up(
    server, tiny_model, tmp_path, capacity_wait_s
) -> None:
    """The server holds 5; 8 rollouts at once would be refused one by one (counted as failed). Refused
    with the numbers, or (when the factory waits for a free slot) a warning."""
    factory = functools.partial(
        HarborSessionFactory, server.url, split="env-tasks", harness="env-factory", sandbox="local",
        model="tiny", capacity_wait_s=capacity_wait_s,
    )  # fmt: skip
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path / "run"), report_to="jsonl", max_steps=1, num_generations=2,
        per_device_train_batch_size=8, max_concurrent_rollouts=8, vllm_server_base_url=None,
    )  # fmt: skip
    rows = [{"task_id": "echo-0"}]
    trainer = HarnessAsyncGRPOTrainer(tiny_model[0], factory, config, train_dataset=rows)
    expected = r"hold 5 live rollouts at most .* max_concurrent_rollouts is 8: give the servers at least 9"
    if capacity_wait_s:
        with pytest.warns(UserWarning, match=expected):
            trainer._start_rollouts()
        trainer.worker.stop()
    else:
        with pytest.raises(TrainerConfigError, match=expected):
            trainer.train()
