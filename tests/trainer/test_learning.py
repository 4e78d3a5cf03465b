"""The trainer learns: GRPO on the real tiny model, sampling from the real embedded engine (gloo weight
sync after every step; the initial push makes the engine version 1), on a dense-reward task (fraction of sampled tokens in a target range). Fresh
samples after training score higher than before by many standard errors."""

from __future__ import annotations

import functools
import math
import statistics

import httpx

from tests.trainer.direct import DirectSessionFactory
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer

TARGETS = list(range(1000, 1400))  # 8% of the vocabulary: rare at first, yet most groups have a hit
TASKS = [{"task_id": f"t{i}", "prompt_ids": [20 + i, 31, 42, 53 + i], "targets": TARGETS} for i in range(4)]


def fresh_rewards(url: str, n: int = 48) -> list[float]:
    factory = DirectSessionFactory(url, sampling={"temperature": 1.0, "max_tokens": 8})
    rewards = [factory.create(TASKS[i % 4], seed=10_000 + i).verify().env_reward for i in range(n)]
    factory.close()
    return rewards


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def test_fresh_sample_reward_rises(fresh_engine, tiny_model, tmp_path) -> None:
    before, before_se = mean_se(fresh_rewards(fresh_engine.url))
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path / "run"), report_to="jsonl", seed=1, max_steps=20, num_generations=8,
        per_device_train_batch_size=16, max_concurrent_rollouts=16, learning_rate=1e-2, max_completion_length=8,
        vllm_server_base_url=fresh_engine.url, weight_sync_backend="gloo", max_staleness=1,
    )  # fmt: skip
    factory = functools.partial(DirectSessionFactory, fresh_engine.url)
    trainer = HarnessAsyncGRPOTrainer(tiny_model[0], factory, config, train_dataset=TASKS)
    history = trainer.train()
    after, after_se = mean_se(fresh_rewards(fresh_engine.url))
    print(f"reward before {before:.3f}±{before_se:.3f} after {after:.3f}±{after_se:.3f}")
    print([round(h["reward"], 3) for h in history])
    assert after - before > 3 * math.hypot(before_se, after_se)
    assert (
        httpx.get(f"{fresh_engine.url}/weight_info").json()["weight_version"] == str(trainer.policy_version) == "21"
    )
    assert all(h["staleness"] <= 1 for h in history)
    assert history[-1]["policy_version"] == 21 and "training_tok/s" in history[-1]
