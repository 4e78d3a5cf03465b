"""A real SIGINT in the middle of a GRPO step's update: `harbor train`'s guard (harbor_rl.interrupts.held)
lets the step finish, the trainer checkpoints it, and a resumed run goes on at the next step with the
saved optimizer state and the prompts the first run had not consumed."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal

import pytest
import torch

from engine.tiny_model import load_model_and_tokenizer
from harbor_rl import interrupts
from tests.trainer.direct import DirectSessionFactory
from trainer.checkpoints import OPTIMIZER_FILE, STATE_FILE, checkpoints
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer

# Half the vocabulary is a target: a group's four rollouts all but always differ, so every step updates
# the weights and the optimizer's state (a group without spread trains nothing).
TASKS = [
    {"task_id": f"t{i}", "prompt_ids": [20 + i, 31, 42], "targets": list(range(0, 3072))} for i in range(5)
]


def trainer_for(engine_url: str, tiny_dir, out, max_steps: int, on_step=None) -> HarnessAsyncGRPOTrainer:
    config = AsyncGRPOConfig(
        output_dir=str(out), report_to="jsonl", seed=7, max_steps=max_steps, num_generations=4,
        per_device_train_batch_size=4, max_concurrent_rollouts=4, learning_rate=1e-3, max_completion_length=4,
        vllm_server_base_url=None,  # the direct factory samples itself; save_steps 0: no checkpoint but the last
    )  # fmt: skip
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    factory = functools.partial(DirectSessionFactory, engine_url)
    trainer = HarnessAsyncGRPOTrainer(
        model, factory, config, train_dataset=TASKS, processing_class=tokenizer, step_callback=on_step
    )
    trainer.update_guard = interrupts.held
    return trainer


def test_a_sigint_inside_an_update_checkpoints_that_step_and_resume_goes_on_after_it(
    fresh_engine, tiny_dir, tmp_path
) -> None:
    def signal_at_step_2(step: int, _metrics) -> None:
        if step == 2:  # inside the held update: the signal must wait for the step's bookkeeping to end
            os.kill(os.getpid(), signal.SIGINT)

    first = trainer_for(fresh_engine.url, tiny_dir, tmp_path, max_steps=10, on_step=signal_at_step_2)
    with interrupts.handling("train"), pytest.raises(KeyboardInterrupt):
        first.train()
    assert interrupts.interrupted() is False  # handling() gave the process its own handlers back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    assert first.step == 2 and first.interrupted_checkpoint == tmp_path / "checkpoint-2"
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2"]
    state = json.loads((tmp_path / "checkpoint-2" / STATE_FILE).read_text())
    assert state["global_step"] == 2
    # The schedule holds the two steps' prompts exactly (one group a step, in order), none of a third.
    assert state["schedule"]["prefix"] == 2 and state["schedule"]["beyond"] == []
    saved = torch.load(tmp_path / "checkpoint-2" / OPTIMIZER_FILE, weights_only=True)
    live = first.optimizer.state_dict()["state"]
    assert saved["state"].keys() == live.keys() and live
    for index, values in live.items():
        assert all(torch.equal(saved["state"][index][k], v) for k, v in values.items())
    some = next(iter(live))
    assert int(saved["state"][some]["step"]) == 2  # AdamW's own count: two updates, not one, not three

    second = trainer_for(fresh_engine.url, tiny_dir, tmp_path, max_steps=4)
    second.train(resume_from_checkpoint=True)
    assert [h["step"] for h in second.history] == [3, 4]
    assert int(second.optimizer.state_dict()["state"][some]["step"]) == 4  # went on from the saved state
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    # No prompt trained twice, none skipped (one group in flight at a time: groups finish in order).
    assert first.consumed_positions[:2] == [0, 1] and second.consumed_positions == [2, 3]


def test_without_the_guard_an_interrupt_inside_an_update_writes_no_checkpoint(
    fresh_engine, tiny_dir, tmp_path
) -> None:
    """A library user's own Ctrl-C (Python's handler) may land mid-update: weights and step count would
    disagree, so nothing is saved rather than a checkpoint that resumes wrong."""

    def interrupt_at_step_1(step: int, _metrics) -> None:
        raise KeyboardInterrupt

    trainer = trainer_for(fresh_engine.url, tiny_dir, tmp_path, max_steps=5, on_step=interrupt_at_step_1)
    trainer.update_guard = contextlib.nullcontext  # the library's default
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.interrupted_checkpoint is None and checkpoints(tmp_path) == []
