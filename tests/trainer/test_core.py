"""Config, advantages, rows -> packed batches, and the loss with every importance-sampling mode, checked
against numbers worked out by hand (in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from capture_proxy.rows import build_training_rows
from tests.capture.builders import Rollout, trace_model
from trainer.advantages import group_advantages
from trainer.config import AsyncGRPOConfig
from trainer.errors import PackingError, TrainerConfigError
from trainer.loss import LossSettings, grpo_loss, importance_weights
from trainer.packing import TrainItem, pack, split_by_tokens

# -- config ------------------------------------------------------------------------------------------


def test_config_defaults_follow_trl() -> None:
    c = AsyncGRPOConfig()
    assert (c.num_generations, c.temperature, c.learning_rate, c.epsilon, c.max_staleness) == (
        8,
        1.0,
        1e-6,
        0.2,
        4,
    )
    assert c.importance_sampling_mode == "token_truncate" and c.importance_sampling_max == 3.0
    assert c.clip_high == 0.2 and c.groups_per_step == 1


def test_config_rejects_partial_groups_and_bad_bounds(tmp_path) -> None:
    with pytest.raises(ValueError, match="multiple of num_generations"):
        AsyncGRPOConfig(num_generations=3, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="importance_sampling_min"):
        AsyncGRPOConfig(importance_sampling_min=3.0, importance_sampling_max=2.0)
    bad = tmp_path / "c.yaml"
    bad.write_text("epsilon: 2.0\nnum_generations: 4\nper_device_train_batch_size: 4\n")
    with pytest.raises(TrainerConfigError, match=r"epsilon: .*less than 1"):
        AsyncGRPOConfig.from_yaml(bad)
    assert AsyncGRPOConfig.from_yaml(bad, epsilon=0.1).epsilon == 0.1
    with pytest.raises(TrainerConfigError, match="no_such_knob"):
        AsyncGRPOConfig.validated({"no_such_knob": 1})


# -- advantages --------------------------------------------------------------------------------------


def test_advantages_leave_none_out_of_the_baseline() -> None:
    # scoreable 1, 0, 0.5: mean 0.5, sample std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    g = group_advantages([1.0, None, 0.0, 0.5])
    assert g.mean == 0.5 and g.std == pytest.approx(0.5) and g.num_scoreable == 3 and not g.zero_spread
    assert g.advantages[1] is None
    assert g.advantages[0] == pytest.approx(1.0) and g.advantages[2] == pytest.approx(-1.0)
    assert g.advantages[3] == 0.0


def test_negative_scale_shrinks_only_the_below_average_advantages() -> None:
    # mean 0.5, std 0.5 as above: advantages 1, -1, 0 before scaling; the baseline does not move.
    g = group_advantages([1.0, None, 0.0, 0.5], negative_scale=0.25)
    assert g.mean == 0.5 and g.std == pytest.approx(0.5)
    assert g.advantages == (pytest.approx(1.0), None, pytest.approx(-0.25), 0.0)
    assert group_advantages([1.0, 0.0, 0.0], negative_scale=0.0).advantages[1:] == (0.0, 0.0)


def test_zero_spread_and_unscoreable_groups_carry_no_signal() -> None:
    same = group_advantages([0.7, 0.7, None])
    assert same.zero_spread and same.advantages == (0.0, 0.0, None)
    lone = group_advantages([None, 1.0])
    assert lone.zero_spread and lone.std is None and lone.advantages == (None, 0.0)
    none = group_advantages([None, None])
    assert none.zero_spread and none.num_scoreable == 0 and none.mean is None
    with pytest.raises(ValueError, match="not finite"):
        group_advantages([math.nan, 1.0])


# -- rows and packing --------------------------------------------------------------------------------


def compacted_trace():
    """Two calls that extend each other, then a compaction (rewritten history) and two more calls."""
    r = Rollout()
    r.call("a", [20, 21], logps=[-0.1, -0.2])
    r.tool([30, 31])
    r.call("b", [40], logps=[-0.7])
    compacted = Rollout([1, 2, 3, 70, 71])
    compacted.turns = r.turns
    compacted.call("c", [80, 81], logps=[-0.3, -0.4])
    compacted.tool([32])
    compacted.call("d", [90], logps=[-0.5])
    return trace_model(r.turns, multi_step_task=True)


def test_rows_from_a_multi_turn_trace_with_a_compaction_pack_without_retokenising() -> None:
    rows = build_training_rows(compacted_trace())
    assert [r.node_ids for r in rows] == [("a", "b"), ("c", "d")]
    first, second = rows
    assert first.input_ids == (1, 2, 3, 20, 21, 30, 31, 40)
    assert first.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert second.input_ids == (1, 2, 3, 70, 71, 80, 81, 32, 90)
    assert second.behavior_logps == (0, 0, 0, 0, 0, -0.3, -0.4, 0, -0.5)

    batch = pack([TrainItem(first, 1.5), TrainItem(second, 1.5)])
    assert batch.input_ids.tolist() == [list(first.input_ids) + list(second.input_ids)]
    assert batch.position_ids.tolist() == [list(range(8)) + list(range(9))]
    assert batch.sequence_ids.tolist() == [[0] * 8 + [1] * 9]
    assert batch.attention_mask is None and batch.num_tokens == 17 and batch.num_trained_tokens == 6
    assert batch.behavior_logps[0, :8].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.7])
    assert batch.advantages.unique().tolist() == [1.5]

    padded = pack([TrainItem(first, 1.0), TrainItem(second, -1.0)], padding_free=False, pad_token_id=5)
    assert padded.input_ids.shape == (2, 9) and padded.input_ids[0, 8] == 5
    assert padded.attention_mask[0].tolist() == [1] * 8 + [0] and padded.sequence_ids[0, 8] == -1
    assert padded.advantages[1, :9].unique().tolist() == [-1.0] and padded.num_trained_tokens == 6


def test_token_budget_batching_keeps_order_and_isolates_long_rows() -> None:
    first, second = build_training_rows(compacted_trace())
    items = [TrainItem(first, 0.0), TrainItem(second, 0.0), TrainItem(first, 0.0)]  # 8, 9, 8 tokens
    assert [[i.num_tokens for i in g] for g in split_by_tokens(items, 17)] == [[8, 9], [8]]
    assert [[i.num_tokens for i in g] for g in split_by_tokens(items, 5)] == [[8], [9], [8]]
    assert len(split_by_tokens(items, None)) == 1
    with pytest.raises(PackingError, match="no rows"):
        pack([])


# -- loss and importance sampling --------------------------------------------------------------------

# Two rows, three trained tokens: row 0 has tokens t0, t1; row 1 has t2.
BEHAVIOR = torch.tensor([-1.0, -2.0, -0.5])
PROX = torch.tensor([-0.5, -2.5, -0.5])  # log w = 0.5, -0.5, 0  -> w = 1.6487, 0.6065, 1
SEQ = torch.tensor([0, 0, 1])
MASK = torch.ones(3)


def weights(mode: str, w_min: float = 0.0, w_max: float = 3.0) -> list[float]:
    w, _ = importance_weights(PROX, BEHAVIOR, MASK, SEQ, 2, LossSettings(mode=mode, w_min=w_min, w_max=w_max))
    return w.tolist()


def test_token_modes_on_hand_computed_weights() -> None:
    e = math.exp
    assert weights("token_truncate") == pytest.approx([e(0.5), e(-0.5), 1.0])
    assert weights("token_truncate", w_min=0.8, w_max=1.5) == pytest.approx([1.5, 0.8, 1.0])
    assert weights("token_mask", w_min=0.8, w_max=1.5) == pytest.approx([0.0, 0.0, 1.0])
    assert weights("none") == [1.0, 1.0, 1.0]


def test_sequence_modes_use_the_summed_log_ratio_of_each_row() -> None:
    # Row 0: 0.5 + (-0.5) = 0 -> w = 1 on both tokens; row 1: 0 -> 1. Shift t2 to make row 1 differ.
    assert weights("sequence_truncate") == pytest.approx([1.0, 1.0, 1.0])
    prox = torch.tensor([-0.5, -1.0, 1.0 - 0.5])  # row 0: 0.5 + 1.0 = 1.5 -> e^1.5 = 4.48; row 1: e^1
    settings = LossSettings(mode="sequence_truncate", w_max=3.0)
    w, corrected = importance_weights(prox, BEHAVIOR, MASK, SEQ, 2, settings)
    assert w.tolist() == pytest.approx([3.0, 3.0, math.e]) and corrected.tolist() == [1.0, 1.0, 0.0]
    w, _ = importance_weights(prox, BEHAVIOR, MASK, SEQ, 2, LossSettings(mode="sequence_mask", w_max=3.0))
    assert w.tolist() == pytest.approx([0.0, 0.0, math.e])


def test_clipped_loss_against_a_hand_computed_value() -> None:
    # logp - prox = 0.3, -0.3, 0.1 -> r = 1.3499, 0.7408, 1.1052; A = +1 (row 0), -2 (row 1).
    # clip(r, 0.8, 1.2) = 1.2, 0.8, 1.1052.
    # t0: A>0, min(1.3499, 1.2) = 1.2             -> -w0 * 1.2   with w0 = e^0.5 = 1.6487 -> -1.97846
    # t1: A>0, min(0.7408, 0.8) = 0.7408          -> -w1 * 0.7408 with w1 = e^-0.5 = 0.6065 -> -0.44933
    # t2: A<0, min(-2.2103, -2.2103) = -2.2103    -> +1 * 2.2103                             ->  2.21034
    # sum = -0.21745; normalised by 3 trained tokens -> -0.072484
    logps = (PROX + torch.tensor([0.3, -0.3, 0.1])).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -2.0])
    out = grpo_loss(logps, PROX, BEHAVIOR, adv, MASK, SEQ, 2, 3, LossSettings(epsilon=0.2, epsilon_high=0.2))
    assert out.loss.item() == pytest.approx(-0.072484, abs=1e-5)
    out.loss.backward()
    # t0 is clipped (no gradient); t1: d/dlogp of -w1 * r * A / 3 = -0.6065 * 0.7408 / 3; t2: +2 * 1.1052 / 3
    assert logps.grad.tolist() == pytest.approx([0.0, -0.149776, 0.736781], abs=1e-5)
    assert out.sums["clip_ratio/high_mean"] == 1.0 and out.sums["clip_ratio/low_mean"] == 0.0
    # k3 KL per token, delta = prox - behavior = 0.5, -0.5, 0: (e^.5-.5-1) + (e^-.5+.5-1) + 0
    assert out.sums["kl"] == pytest.approx(0.148721 + 0.106531, abs=1e-5)


def test_loss_type_grpo_averages_each_row_then_the_rows_of_the_step() -> None:
    # The per-token terms of the hand-computed case above: t0 -1.97846, t1 -0.44933 (row 0), t2 2.21034.
    logps = PROX + torch.tensor([0.3, -0.3, 0.1])
    adv = torch.tensor([1.0, 1.0, -2.0])
    settings = LossSettings(epsilon=0.2, epsilon_high=0.2, loss_type="grpo")
    out = grpo_loss(logps, PROX, BEHAVIOR, adv, MASK, SEQ, 2, 3, settings, num_rows=2)
    # Row 0's mean (-1.213895) and row 1's (2.21034) weigh the same; dapo would give -0.072484.
    assert out.loss.item() == pytest.approx((-1.213895 + 2.21034) / 2, abs=1e-5)
    # A micro-batch holding these two of a step's four rows contributes its share of the step's mean.
    out = grpo_loss(logps, PROX, BEHAVIOR, adv, MASK, SEQ, 2, 3, settings, num_rows=4)
    assert out.loss.item() == pytest.approx((-1.213895 + 2.21034) / 4, abs=1e-5)
    with pytest.raises(ValueError, match="num_rows"):
        grpo_loss(logps, PROX, BEHAVIOR, adv, MASK, SEQ, 2, 3, settings)


def test_mode_none_uses_behaviour_as_proximal_and_normalises_by_the_step() -> None:
    logps = torch.tensor([-0.8, -2.0, -0.5])  # vs behaviour: r = e^0.2 = 1.2214, 1, 1
    adv = torch.tensor([1.0, 1.0, -2.0])
    out = grpo_loss(logps, None, BEHAVIOR, adv, MASK, SEQ, 2, 6, LossSettings(mode="none"))
    # -(min(1.2214, 1.2) * 1) - 1 * 1 + 2 * 1 = -0.2 over 6 step tokens
    assert out.loss.item() == pytest.approx(-0.2 / 6, abs=1e-6)
    assert out.sums["importance_sampling/weight_mean"] == 3.0
    masked = grpo_loss(
        logps, None, BEHAVIOR, adv, torch.tensor([1.0, 0.0, 0.0]), SEQ, 2, 1, LossSettings(mode="none")
    )
    assert masked.loss.item() == pytest.approx(-1.2, abs=1e-6)
