"""Packed rows under `document_sdpa` (sdpa once per row, trainer.attention): the loss and gradients are
those of padded batches and of today's packed path (sdpa with a dense block-diagonal mask), on the real
tiny model; the mask step hands over row spans only for a pack of causal rows; the trainer gives an sdpa
model the new attention and pads for a model that has no attention keeping packed rows apart."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from capture_proxy.rows import TrainingRow
from trainer.attention import ATTENTION, RowSpans, register, row_spans
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.logprobs import token_logprobs
from trainer.loss import LossSettings, grpo_loss
from trainer.packing import TrainItem, pack


def row(length: int, rng: random.Random) -> TrainingRow:
    ids = [rng.randrange(10, 4000) for _ in range(length)]
    mask = [0] + [int(rng.random() < 0.4) for _ in range(length - 1)]
    mask[-1] = 1
    return TrainingRow(
        input_ids=tuple(ids), loss_mask=tuple(mask), behavior_logps=tuple(-1.0 * m for m in mask),
        node_ids=("n0",), policy_versions=(0,), session_id="s", trained_node_ids=("n0",),
    )  # fmt: skip


RNG = random.Random(3)
ITEMS = [TrainItem(row(n, RNG), a) for n, a in ((37, 1.0), (150, -1.0), (2, 0.5), (90, -0.25))]


def loss_and_grads(model, batch) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    lp = token_logprobs(model, batch, temperature=0.8)
    prox = lp.logps.detach() + 0.05 * batch.loss_mask  # pi_theta moved since the batch began: r != 1
    # Normalised by 1, not the trained tokens: a sum, so that the gradients are well above the tolerance.
    out = grpo_loss(lp.logps, prox, batch.behavior_logps, batch.advantages, batch.loss_mask, batch.sequence_ids,
                    batch.num_sequences, 1, LossSettings())  # fmt: skip
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.loss.item(), lp.logps[batch.loss_mask.bool()].detach(), grads


def test_packed_rows_per_document_give_the_padded_and_dense_mask_loss_and_gradients(tiny_model) -> None:
    model, _ = tiny_model
    assert model.config._attn_implementation == "sdpa"
    packed, padded = pack(ITEMS, padding_free=True), pack(ITEMS, padding_free=False)
    dense = loss_and_grads(model, packed)  # today's packed path: sdpa's block-diagonal mask
    want = loss_and_grads(model, padded)
    model.set_attn_implementation(register())
    got = loss_and_grads(model, packed)
    assert loss_and_grads(model, padded)[0] == want[0]  # padded batches: sdpa exactly as before
    # A packed logprob in the order of padded's (row by row, each row's trained tokens in order).
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-5)
    for reference in (want, dense):
        assert got[0] == pytest.approx(reference[0], abs=1e-5)
        for a, b in zip(got[2], reference[2], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in want[2]) > 1e-3  # the comparison is not of zeros


def test_the_mask_step_gives_spans_only_for_causal_rows() -> None:
    from transformers.masking_utils import (
        and_masks,
        causal_mask_function,
        packed_sequence_mask_function,
        remap_positions_for_packed_sequence,
        sliding_window_causal_mask_function,
    )

    position_ids = torch.tensor([[0, 1, 2, 0, 0, 1, 2, 3]])
    rows = torch.tensor([[0, 0, 0, 1, 2, 2, 2, 2]])

    def packed(mask):
        causal_in_rows = remap_positions_for_packed_sequence(mask, position_ids)
        return and_masks(causal_in_rows, packed_sequence_mask_function(rows))

    assert row_spans(packed(causal_mask_function), 8, "cpu") == RowSpans(((0, 3), (3, 4), (4, 8)))
    assert row_spans(causal_mask_function, 8, "cpu") == RowSpans(((0, 8),))
    assert row_spans(packed(sliding_window_causal_mask_function(2)), 8, "cpu") is None  # row 3 is 4 long
    assert row_spans(lambda b, h, q, kv: q >= 0, 8, "cpu") is None  # bidirectional
    fits = packed(sliding_window_causal_mask_function(4))  # every row fits the window: causal rows
    assert row_spans(fits, 8, "cpu") == RowSpans(((0, 3), (3, 4), (4, 8)))


def _trainer(model, tmp_path, **kwargs) -> HarnessAsyncGRPOTrainer:
    config = AsyncGRPOConfig(output_dir=str(tmp_path), num_generations=1, report_to="none", **kwargs)
    return HarnessAsyncGRPOTrainer(model, lambda **_: None, config, train_dataset=[{"prompt": "x"}])


def test_the_trainer_packs_an_sdpa_model_per_document_and_pads_an_eager_one(tiny_model, tmp_path, caplog):
    model, _ = tiny_model
    assert _trainer(model, tmp_path, packed_attention="model").padding_free
    assert model.config._attn_implementation == "sdpa"  # `model`: left as loaded
    assert not _trainer(model, tmp_path, padding_free=False).padding_free
    assert model.config._attn_implementation == "sdpa"
    assert _trainer(model, tmp_path).padding_free
    assert model.config._attn_implementation == ATTENTION
    batches = _trainer(model, tmp_path)._micro_batches(ITEMS)
    assert [b.input_ids.shape[0] for b in batches] == [1]  # one pack

    model.set_attn_implementation("eager")
    with caplog.at_level(logging.WARNING, logger="trainer.grpo"):
        trainer = _trainer(model, tmp_path)
    assert not trainer.padding_free and "pads batches instead" in caplog.text
    assert trainer._micro_batches(ITEMS)[0].attention_mask is not None
