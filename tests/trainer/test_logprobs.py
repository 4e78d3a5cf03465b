"""Logprobs at the trained tokens only, and rows that share a long prompt running it once: the loss and
gradients stay those of the lm head over every position of the whole rows (the real tiny model)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from capture_proxy.rows import TrainingRow
from trainer import logprobs
from trainer.logprobs import shared_prefix_length, token_logprobs
from trainer.loss import LossSettings, grpo_loss
from trainer.packing import TrainItem, chunk_by_prefix, pack

PROMPT = [10 + (i % 200) for i in range(100)]  # the long first prompt every rollout of a task starts with


def row(tail: list[int], trained: list[int]) -> TrainingRow:
    """PROMPT + tail, training the tail positions listed in `trained` (tool output stays context)."""
    ids = PROMPT + tail
    mask = [0] * len(ids)
    for t in trained:
        mask[len(PROMPT) + t] = 1
    return TrainingRow(
        input_ids=tuple(ids), loss_mask=tuple(mask), behavior_logps=tuple([-1.0 if m else 0.0 for m in mask]),
        node_ids=("n0",), policy_versions=(0,), session_id="s", trained_node_ids=("n0",),
    )  # fmt: skip


ROWS = [
    row([40, 41, 42, 300, 301, 43], trained=[0, 1, 2, 5]),
    row([50, 51], trained=[0, 1]),
    row([60, 61, 62, 63, 64, 65, 66, 67], trained=[2, 3, 7]),
]


def logps_and_grads(model, batch) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    model.zero_grad()
    lp = token_logprobs(model, batch, temperature=0.8, with_entropy=True)
    (lp.logps * batch.loss_mask * torch.tensor([[1.0], [-2.0], [0.5]])).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return lp.logps.detach(), grads, lp.entropy * batch.loss_mask


def test_a_shared_prompt_runs_once_with_the_same_logprobs_and_gradients(tiny_model, monkeypatch) -> None:
    model, _ = tiny_model
    batch = pack([TrainItem(r, 1.0) for r in ROWS], padding_free=False)
    assert shared_prefix_length(batch) == len(PROMPT)  # up to the first trained token
    shared = logps_and_grads(model, batch)
    monkeypatch.setattr(logprobs, "SHARED_PREFIX_MIN_TOKENS", 10_000)  # every row computed whole
    assert shared_prefix_length(batch) == 0
    whole = logps_and_grads(model, batch)

    mask = batch.loss_mask.bool()
    assert shared[0][mask].tolist() == pytest.approx(whole[0][mask].tolist(), abs=2e-5)
    assert shared[2][mask].tolist() == pytest.approx(whole[2][mask].tolist(), abs=2e-5)
    for a, b in zip(shared[1], whole[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    assert max(g.abs().max().item() for g in whole[1]) > 1e-3  # the comparison is not of zeros


def full_logits_logprobs(model, batch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the lm head and softmax at every position of the whole rows, then the trained
    tokens' logprobs and entropies picked out (zero elsewhere)."""
    kwargs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    if batch.attention_mask is not None:
        kwargs["attention_mask"] = batch.attention_mask
    log_probs = torch.log_softmax(model(**kwargs).logits[:, :-1].float() / temperature, dim=-1)
    picked = log_probs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1).detach()
    lead = picked.new_zeros(picked.shape[0], 1)
    return torch.cat([lead, picked], 1) * batch.loss_mask, torch.cat([lead, entropy], 1) * batch.loss_mask


def loss_and_grads(model, batch, logps) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    prox = logps.detach() + 0.05 * batch.loss_mask  # pi_theta moved since the batch began: r != 1
    out = grpo_loss(logps, prox, batch.behavior_logps, batch.advantages, batch.loss_mask, batch.sequence_ids,
                    batch.num_sequences, 1, LossSettings())  # fmt: skip
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.loss.item(), grads


OTHER = row([70, 71, 72, 73], trained=[1, 3])
OTHER = dataclasses.replace(OTHER, input_ids=tuple(reversed(PROMPT)) + OTHER.input_ids[len(PROMPT) :])


@pytest.mark.parametrize(
    "padding_free, rows, prefix",
    [(True, ROWS, 0), (False, [ROWS[0], OTHER, ROWS[2]], 0), (False, ROWS, len(PROMPT))],
    ids=["packed", "padded", "shared-prefix"],
)
def test_trained_tokens_alone_give_the_full_logits_loss_and_gradients(tiny_model, padding_free, rows, prefix):
    model, _ = tiny_model
    items = [TrainItem(r, a) for r, a in zip(rows, (1.0, -1.0, 0.5), strict=True)]
    batch = pack(items, padding_free=padding_free)
    assert shared_prefix_length(batch) == prefix
    lp = token_logprobs(model, batch, temperature=0.8, with_entropy=True)
    want_logps, want_entropy = full_logits_logprobs(model, batch, temperature=0.8)

    untrained = batch.loss_mask == 0
    assert untrained.any() and (lp.logps[untrained] == 0).all() and (lp.entropy[untrained] == 0).all()
    torch.testing.assert_close(lp.logps, want_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(lp.entropy, want_entropy, rtol=0, atol=1e-5)
    loss, grads = loss_and_grads(model, batch, lp.logps)
    want_loss, want_grads = loss_and_grads(model, batch, full_logits_logprobs(model, batch, 0.8)[0])
    assert loss == pytest.approx(want_loss, abs=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in want_grads) > 1e-3  # the comparison is not of zeros


class WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward takes no `logits_to_keep` (a custom or older model)."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, position_ids, use_cache, attention_mask=None):
        return self.lm(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                       use_cache=use_cache)  # fmt: skip


def test_a_model_without_logits_to_keep_gets_the_same_logprobs(tiny_model) -> None:
    model, _ = tiny_model
    for padding_free in (True, False):
        batch = pack([TrainItem(r, 1.0) for r in ROWS], padding_free=padding_free)
        with torch.no_grad():
            got = token_logprobs(WithoutLogitsToKeep(model), batch, temperature=0.8, with_entropy=True)
            want_logps, want_entropy = full_logits_logprobs(model, batch, temperature=0.8)
        torch.testing.assert_close(got.logps, want_logps, rtol=0, atol=1e-5)
        torch.testing.assert_close(got.entropy, want_entropy, rtol=0, atol=1e-5)


def test_the_prefix_is_shared_only_where_it_pays_and_is_exact() -> None:
    items = [TrainItem(r, 1.0) for r in ROWS]
    assert shared_prefix_length(pack(items, padding_free=True)) == 0  # packed rows sit side by side
    assert shared_prefix_length(pack(items[:1], padding_free=False)) == 0  # one row: nothing to share
    early = [TrainItem(row([40, 41], [0]), 1.0), TrainItem(row([50], [0]), 1.0)]
    early[0] = TrainItem(dataclasses.replace(early[0].row, loss_mask=(0,) * 60 + (1,) + (0,) * 41), 1.0)
    assert shared_prefix_length(pack(early, padding_free=False)) == 0  # a token trained at 60 < 64
    other = dataclasses.replace(row([1], [0]), input_ids=(7,) * 70 + tuple(PROMPT[70:]) + (1,))
    assert shared_prefix_length(pack([items[0], TrainItem(other, 1.0)], padding_free=False)) == 0


def test_micro_batches_keep_the_rows_of_one_prompt_together() -> None:
    # Two tasks whose first prompts share a system prompt (80 tokens) and then differ (300 more): rows
    # arrive interleaved, as groups finish; each chunk holds one task's rows, at most `size` of them.
    system = [5] * 80

    def task_row(task: int, tail: list[int]) -> TrainingRow:
        prompt = system + [task] * 300
        return TrainingRow(
            input_ids=tuple(prompt + tail), loss_mask=tuple([0] * len(prompt) + [1] * len(tail)),
            behavior_logps=tuple([0.0] * len(prompt) + [-1.0] * len(tail)), node_ids=("n",),
            policy_versions=(0,), session_id=f"s{task}", trained_node_ids=("n",),
        )  # fmt: skip

    items = [TrainItem(task_row(task, [100 + i]), 1.0) for i in range(5) for task in (1, 2)]
    chunks = chunk_by_prefix(items, size=3, min_shared=64)
    assert [len(c) for c in chunks] == [3, 2, 3, 2]
    assert all(len({item.row.session_id for item in chunk}) == 1 for chunk in chunks)
    assert sorted(id(i) for c in chunks for i in c) == sorted(id(i) for i in items)  # none lost or repeated
    assert all(shared_prefix_length(pack(c, padding_free=False)) == 380 for c in chunks)


def test_tails_of_very_different_lengths_run_in_groups_with_the_same_loss(tiny_model, monkeypatch) -> None:
    """Two short answers and two long ones behind one prompt: the short tails are not padded to the long
    ones (two groups), and the loss and gradients are today's single group's, and the full logits'."""
    model, _ = tiny_model
    tails = [list(range(200, 202)), list(range(300, 303)), list(range(400, 470)), list(range(500, 572))]
    rows = [row(t, trained=list(range(0, len(t), 3))) for t in tails]
    batch = pack([TrainItem(r, a) for r, a in zip(rows, (1.0, -1.0, 0.5, -0.5), strict=True)], padding_free=False)
    assert logprobs.tail_buckets([len(t) for t in tails]) == [[0, 1], [2, 3]]
    grouped = token_logprobs(model, batch, temperature=0.8, with_entropy=True)
    loss, grads = loss_and_grads(model, batch, grouped.logps)
    monkeypatch.setattr(logprobs, "BUCKET_OVERHEAD_TOKENS", 10**9)  # one group: every tail padded to 72
    assert logprobs.tail_buckets([len(t) for t in tails]) == [[0, 1, 2, 3]]
    single = token_logprobs(model, batch, temperature=0.8, with_entropy=True)
    single_loss, single_grads = loss_and_grads(model, batch, single.logps)
    full_loss, _ = loss_and_grads(model, batch, full_logits_logprobs(model, batch, 0.8)[0])

    torch.testing.assert_close(grouped.logps, single.logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(grouped.entropy, single.entropy, rtol=0, atol=1e-5)
    assert loss == pytest.approx(single_loss, abs=1e-5) and loss == pytest.approx(full_loss, abs=1e-5)
    for got, want in zip(grads, single_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert max(g.abs().max().item() for g in single_grads) > 1e-3  # the comparison is not of zeros


def test_tail_groups_split_where_padding_costs_more_than_a_pass() -> None:
    assert logprobs.tail_buckets([5, 5, 5], overhead=48) == [[0, 1, 2]]
    assert logprobs.tail_buckets([60, 2, 61, 3], overhead=48) == [[1, 3], [0, 2]]
    assert logprobs.tail_buckets([60, 2, 61, 3], overhead=200) == [[1, 3, 0, 2]]
    assert logprobs.tail_buckets([9], overhead=0) == [[0]]
