"""Rows that share a long prompt: the prefix runs once, and logprobs and gradients stay those of the
whole rows (the real tiny model)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from capture_proxy.rows import TrainingRow
from trainer import logprobs
from trainer.logprobs import shared_prefix_length, token_logprobs
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
