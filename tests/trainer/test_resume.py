"""Stop after step k, resume from the checkpoint: the run goes on at k+1 with the saved weights and
optimizer, and the prompts it trains are exactly the ones the first run had not consumed."""

from __future__ import annotations

import functools
import json

import torch

from engine.tiny_model import load_model_and_tokenizer
from tests.trainer.direct import DirectSessionFactory
from trainer.checkpoints import checkpoints
from trainer.config import AsyncGRPOConfig
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
