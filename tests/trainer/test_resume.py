"""Stop after step k, resume from the checkpoint: the run goes on at k+1 with the saved weights and
optimizer, and the prompts it trains are exactly the ones the first run had not consumed."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from engine.tiny_model import load_model_and_tokenizer
from tests.trainer.direct import DirectSessionFactory
from trainer.checkpoints import checkpoints
from trainer.config import AsyncGRPOConfig
from trainer.errors import TrainerConfigError
from trainer.grpo import HarnessAsyncGRPOTrainer

TASKS = [
    {"task_id": f"t{i}", "prompt_ids": [20 + i, 31, 42], "targets": list(range(1000, 1100))} for i in range(5)
]


def run(engine_url: str, tiny_dir, out, max_steps: int, resume: bool) -> HarnessAsyncGRPOTrainer:
    config = AsyncGRPOConfig(
        output_dir=str(out), report_to="jsonl", seed=7, max_steps=max_steps, num_generations=4,
        per_device_train_batch_size=4, max_concurrent_rollouts=4, learning_rate=1e-3, max_completion_length=4,
        save_steps=1, save_total_limit=2, vllm_server_base_url=None,  # the direct factory samples itself
    )  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    factory = functools.partial(DirectSessionFactory, engine_url)
    trainer = HarnessAsyncGRPOTrainer(model, factory, config, train_dataset=TASKS, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer


def test_resume_continues_at_the_next_step_without_replaying_or_skipping(
    fresh_engine, tiny_dir, tmp_path
) -> None:
    first = run(fresh_engine.url, tiny_dir, tmp_path, max_steps=3, resume=False)
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]  # save_total_limit=2
    saved = {k: v.clone() for k, v in first.model.state_dict().items()}
    reloaded, _ = load_model_and_tokenizer(checkpoints(tmp_path)[-1])
    assert all(torch.equal(saved[k], v) for k, v in reloaded.state_dict().items())

    second = run(fresh_engine.url, tiny_dir, tmp_path, max_steps=5, resume=True)
    assert [h["step"] for h in second.history] == [4, 5]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    # The resumed model went on from the checkpoint's weights with two more updates.
    assert any(not torch.equal(saved[k], v) for k, v in second.model.state_dict().items())
    # One group in flight at a time, so groups finish in order. No prompt trained twice, none skipped:
    # the two runs' positions together are 0..4 once each.
    together = first.consumed_positions + second.consumed_positions
    assert len(together) == 5 and sorted(together) == list(range(5))
    assert not set(first.consumed_positions) & set(second.consumed_positions)
    assert second.schedule.prefix == 5 and not second.schedule.beyond
    # The checkpoint is a servable model folder.
    assert (checkpoints(tmp_path)[-1] / "tokenizer.json").is_file()


class CountingSync:
    """A weight transport that records the versions pushed (the trainer accepts any `weight_sync`)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[int, int]] = []

    def wait_ready(self, timeout_s: float) -> None:
        return None

    def push(self, stream, version: int) -> int:
        self.pushed.append((version, sum(t.numel() for _, t in stream)))
        return version


def test_weights_pushed_before_train_are_not_pushed_again_unless_a_resume_changed_them(
    fresh_engine, tiny_dir, tmp_path
) -> None:
    """`harbor train` pushes the warm-up's weights to evaluate them, then trains: train() makes no
    first push of its own then, and does again when a checkpoint replaced the weights."""
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path), report_to="jsonl", seed=7, max_steps=1, num_generations=4,
        per_device_train_batch_size=4, max_concurrent_rollouts=4, learning_rate=1e-3, max_completion_length=4,
        save_steps=1, vllm_server_base_url=None,
    )  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    sync = CountingSync()
    factory = functools.partial(DirectSessionFactory, fresh_engine.url)
    trainer = HarnessAsyncGRPOTrainer(
        model, factory, config, train_dataset=TASKS, processing_class=tokenizer, weight_sync=sync
    )
    trainer.sync_weights()
    trainer.train()
    size = sum(p.numel() for p in model.parameters())
    assert sync.pushed == [(1, size), (2, size)]  # the evaluation's push, then the step's: no other
    assert trainer.history[0]["policy_version"] == 2

    again = HarnessAsyncGRPOTrainer(
        model, factory, config.model_copy(update={"max_steps": 2}), train_dataset=TASKS,
        processing_class=tokenizer, weight_sync=sync,
    )  # fmt: skip
    again.sync_weights()
    again.train(resume_from_checkpoint=True)  # the checkpoint's weights replace the pushed ones
    assert [v for v, _ in sync.pushed] == [1, 2, 1, 3, 4]


def test_sync_weights_without_an_engine_says_what_is_missing(tiny_dir, tmp_path) -> None:
    config = AsyncGRPOConfig(output_dir=str(tmp_path), vllm_server_base_url=None)
    trainer = HarnessAsyncGRPOTrainer(load_model_and_tokenizer(tiny_dir)[0], lambda **_: None, config, TASKS)
    with pytest.raises(TrainerConfigError, match="no engine to push weights to"):
        trainer.sync_weights()
