"""Training rows -> model batches, from the captured token ids as they are (never re-tokenised).

Padding-free (default): the rows of a micro-batch are concatenated into one (1, T) sequence whose
position ids restart at 0 for each row; transformers reads the restarts as sequence boundaries and
keeps attention inside each row (`find_packed_sequence_indices`), so no token is wasted on padding.
With `sdpa` it does so with a dense (T, T) mask; the trainer gives such models `document_sdpa`
(trainer.attention), which runs attention row by row instead.
Padded: a (rows, longest) batch with an attention mask, for models that do not support packing.

Every per-token tensor is aligned with `input_ids`: position t holds the loss mask, the engine's
behaviour logprob and the advantage of token t (the token predicted from positions < t).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from capture_proxy.rows import TrainingRow
from trainer.errors import PackingError


@dataclass(frozen=True)
class TrainItem:
    """One row and the advantage of the rollout that produced it."""

    row: TrainingRow
    advantage: float

    @property
    def num_tokens(self) -> int:
        return len(self.row.input_ids)


@dataclass
class Batch:
    input_ids: torch.Tensor
    """(B, T) token ids; B = 1 when packed."""
    position_ids: torch.Tensor
    """(B, T) position of each token inside its own row."""
    attention_mask: torch.Tensor | None
    """(B, T) 1 on real tokens; None when packed (no padding)."""
    loss_mask: torch.Tensor
    """(B, T) float 1.0 where the token is trained."""
    behavior_logps: torch.Tensor
    """(B, T) the engine's sampled logprob of each trained token (0 elsewhere)."""
    advantages: torch.Tensor
    """(B, T) the rollout's advantage, on every position of its rows."""
    sequence_ids: torch.Tensor
    """(B, T) index of the row each position belongs to (0..num_sequences-1), -1 on padding."""
    num_sequences: int

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens."""
        return int((self.sequence_ids >= 0).sum())

    @property
    def num_trained_tokens(self) -> int:
        return int(self.loss_mask.sum())


def _check(item: TrainItem) -> None:
    row = item.row
    n = len(row.input_ids)
    if n == 0 or len(row.loss_mask) != n or len(row.behavior_logps) != n:
        raise PackingError(
            f"row of session {row.session_id} has {n} tokens but {len(row.loss_mask)} mask values and "
            f"{len(row.behavior_logps)} logprobs; rows come from capture_proxy.rows.build_training_rows"
        )
    if row.loss_mask[0]:
        raise PackingError(f"row of session {row.session_id} trains its first token, which nothing predicts")


def pack(items: Sequence[TrainItem], padding_free: bool = True, pad_token_id: int = 0) -> Batch:
    """One batch from `items` (all of them; split first with `split_by_tokens` to respect a budget)."""
    if not items:
        raise PackingError("cannot build a batch from no rows")
    for item in items:
        _check(item)
    return _packed(items) if padding_free else _padded(items, pad_token_id)


def _packed(items: Sequence[TrainItem]) -> Batch:
    ids, pos, mask, logps, adv, seq = [], [], [], [], [], []
    for i, item in enumerate(items):
        n = item.num_tokens
        ids.extend(item.row.input_ids)
        pos.extend(range(n))
        mask.extend(item.row.loss_mask)
        logps.extend(item.row.behavior_logps)
        adv.extend([item.advantage] * n)
        seq.extend([i] * n)
    return Batch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        attention_mask=None,
        loss_mask=torch.tensor([mask], dtype=torch.float32),
        behavior_logps=torch.tensor([logps], dtype=torch.float32),
        advantages=torch.tensor([adv], dtype=torch.float32),
        sequence_ids=torch.tensor([seq], dtype=torch.long),
        num_sequences=len(items),
    )


def _padded(items: Sequence[TrainItem], pad_token_id: int) -> Batch:
    width = max(item.num_tokens for item in items)
    shape = (len(items), width)
    batch = Batch(
        input_ids=torch.full(shape, pad_token_id, dtype=torch.long),
        position_ids=torch.zeros(shape, dtype=torch.long),
        attention_mask=torch.zeros(shape, dtype=torch.long),
        loss_mask=torch.zeros(shape, dtype=torch.float32),
        behavior_logps=torch.zeros(shape, dtype=torch.float32),
        advantages=torch.zeros(shape, dtype=torch.float32),
        sequence_ids=torch.full(shape, -1, dtype=torch.long),
        num_sequences=len(items),
    )
    for i, item in enumerate(items):
        n = item.num_tokens
        batch.input_ids[i, :n] = torch.tensor(item.row.input_ids, dtype=torch.long)
        batch.position_ids[i, :n] = torch.arange(n)
        batch.attention_mask[i, :n] = 1
        batch.loss_mask[i, :n] = torch.tensor(item.row.loss_mask, dtype=torch.float32)
        batch.behavior_logps[i, :n] = torch.tensor(item.row.behavior_logps, dtype=torch.float32)
        batch.advantages[i, :n] = item.advantage
        batch.sequence_ids[i, :n] = i
    return batch


def split_by_tokens(items: Sequence[TrainItem], max_tokens: int | None) -> list[list[TrainItem]]:
    """Consecutive groups of items whose token count stays within `max_tokens` (None: one group).

    A row longer than the budget cannot be cut (it needs its whole context), so it goes alone.
    """
    if max_tokens is None:
        return [list(items)] if items else []
    groups: list[list[TrainItem]] = []
    current: list[TrainItem] = []
    used = 0
    for item in items:
        if current and used + item.num_tokens > max_tokens:
            groups.append(current)
            current, used = [], 0
        current.append(item)
        used += item.num_tokens
    if current:
        groups.append(current)
    return groups


def chunk_by_prefix(items: Sequence[TrainItem], size: int, min_shared: int) -> list[list[TrainItem]]:
    """Chunks of at most `size` items whose rows share most of their prompt, where such rows exist.

    The items are sorted by their token ids, so rows of one task's prompt lie side by side; a chunk is
    cut when it is full or the next row shares less than `min_shared` tokens, or less than half of the
    shorter prompt (the tokens before a row's first trained one), with the chunk's first row. Rollouts
    of different tasks share a harness's system prompt and tool schemas (~200 tokens for mini-swe-agent)
    but not the rest of the first prompt (~1,300), so they land in different chunks. A padded
    micro-batch of one chunk runs its shared prompt once (trainer.logprobs)."""
    ordered = sorted(items, key=lambda item: item.row.input_ids)
    chunks: list[list[TrainItem]] = []
    for item in ordered:
        chunk = chunks[-1] if chunks else None
        if chunk is None or len(chunk) == size or not _share_prompt(chunk[0].row, item.row, min_shared):
            chunks.append([item])
        else:
            chunk.append(item)
    return chunks


def _share_prompt(a: TrainingRow, b: TrainingRow, min_shared: int) -> bool:
    n = min(len(a.input_ids), len(b.input_ids))
    differ = torch.nonzero(torch.tensor(a.input_ids[:n]) != torch.tensor(b.input_ids[:n]))
    shared = int(differ[0, 0]) if len(differ) else n
    return shared >= max(min_shared, min(_prompt_length(a), _prompt_length(b)) / 2)


def _prompt_length(row: TrainingRow) -> int:
    """Tokens before the row's first trained one."""
    return row.loss_mask.index(1) if 1 in row.loss_mask else len(row.loss_mask)
