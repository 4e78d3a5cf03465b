"""Logprobs of the trained tokens of packed rows match a plain forward pass per row, one GRPO update moves a
positive-advantage completion up and a negative one down (the real tiny model, real AdamW), and the
step's rows carry their rollout's advantage as `negative_advantage_scale` sets it."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from capture_proxy.rows import TrainingRow
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.logprobs import token_logprobs
from trainer.loss import LossSettings, grpo_loss
from trainer.packing import TrainItem, pack
from trainer.rollout_worker import RolloutGroup, RolloutSample

PROMPT = [11, 12, 13, 14, 15]


def row(completion: list[int], behavior: list[float]) -> TrainingRow:
    ids = PROMPT + completion
    return TrainingRow(
        input_ids=tuple(ids),
        loss_mask=tuple([0] * len(PROMPT) + [1] * len(completion)),
        behavior_logps=tuple([0.0] * len(PROMPT) + behavior),
        node_ids=("n0",),
        policy_versions=(0,),
        session_id="s",
        trained_node_ids=("n0",),
    )


def reference_logps(model, ids: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


def test_packed_and_padded_logprobs_equal_per_row_forward_passes(tiny_model) -> None:
    model, _ = tiny_model
    rows = [row([40, 41, 42], [-1.0] * 3), row([50, 51], [-1.0] * 2), row([60], [-1.0])]
    for padding_free in (True, False):
        batch = pack([TrainItem(r, 1.0) for r in rows], padding_free=padding_free)
        with torch.no_grad():
            lp = token_logprobs(model, batch, temperature=0.7, with_entropy=True).logps
        for i, r in enumerate(rows):
            got = lp[batch.sequence_ids == i].tolist()
            want = [0.0, *reference_logps(model, list(r.input_ids), 0.7)]  # nothing predicts a first token
            assert got == pytest.approx([w * m for w, m in zip(want, r.loss_mask, strict=True)], abs=2e-5)


def test_one_update_raises_positive_and_lowers_negative_completions(tiny_model) -> None:
    model, _ = tiny_model
    good, bad = [40, 41, 42], [50, 51, 52]
    with torch.no_grad():
        behavior = {tuple(c): reference_logps(model, PROMPT + c, 1.0)[len(PROMPT) - 1 :] for c in (good, bad)}
    items = [
        TrainItem(row(good, behavior[tuple(good)]), 1.0),
        TrainItem(row(bad, behavior[tuple(bad)]), -1.0),
    ]
    batch = pack(items)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lp = token_logprobs(model, batch, temperature=1.0)
    out = grpo_loss(lp.logps, lp.logps.detach(), batch.behavior_logps, batch.advantages, batch.loss_mask,
                    batch.sequence_ids, batch.num_sequences, batch.num_trained_tokens, LossSettings())  # fmt: skip
    # Fresh weights: pi_prox == pi_behavior, so w = 1 and the per-token loss is -A: mean of (-1, -1, -1, 1, 1, 1).
    assert out.loss.item() == pytest.approx(0.0, abs=1e-5) and out.sums["kl"] == pytest.approx(0.0, abs=1e-4)
    out.loss.backward()
    optimizer.step()
    after_good = sum(reference_logps(model, PROMPT + good, 1.0)[len(PROMPT) - 1 :])
    after_bad = sum(reference_logps(model, PROMPT + bad, 1.0)[len(PROMPT) - 1 :])
    assert after_good > sum(behavior[tuple(good)]) + 0.1
    assert after_bad < sum(behavior[tuple(bad)]) - 0.1


@pytest.mark.parametrize(
    "scale, trained", [(1.0, {"good": 0.707107, "bad": -0.707107}), (0.0, {"good": 0.707107})]
)
def test_below_average_rollouts_train_with_the_negative_advantage_scale(scale, trained, tmp_path) -> None:
    # A group of two (rewards 1 and 0): advantages +-0.5 / sqrt(0.5) (mean 0.5, sample std). Scale 0
    # leaves the worse rollout out of the step altogether, so its tokens do not dilute the mean either.
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2,
        negative_advantage_scale=scale,
    )  # fmt: skip
    samples = [
        RolloutSample(0, 1.0, None, rows=[replace(row([40, 41], [-1.0, -1.0]), session_id="good")]),
        RolloutSample(1, 0.0, None, rows=[replace(row([50, 51], [-1.0, -1.0]), session_id="bad")]),
    ]
    trainer = SimpleNamespace(args=config, policy_version=0, reward_fn=None)
    items, stats = HarnessAsyncGRPOTrainer._items(trainer, [RolloutGroup(0, {}, samples, started_version=0)])
    assert {item.row.session_id: round(item.advantage, 6) for item in items} == trained
    assert stats["reward"] == 0.5  # the step's reward still counts every scoreable rollout
