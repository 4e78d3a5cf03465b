"""Per-token logprobs of a Hugging Face causal LM on a packed or padded batch, at the sampling temperature.

The engine reports vLLM's processed logprobs, `log_softmax(logits / temperature)` under the trainer's
sampling policy (top_p=1, top_k=-1), so the trainer divides by the same temperature; otherwise the
importance ratio would measure the temperature, not the policy change.

Agent rollouts of one task begin with the same long prompt (mini-swe-agent's first prompt is ~1,300
tokens of the tiny tokenizer; the tokens trained are ~70 a rollout). A padded micro-batch whose rows
share such a prefix runs it once: the prefix's forward pass with its key/value cache, the cache
repeated for every row, then each row's rest on top of it. The logprobs and their gradients are the
same as those of the whole rows (tests/trainer/test_logprobs.py checks both); the prefix is not
recomputed per row: 8 such rows of ~1.9k tokens took 5 s for forward and backward instead of 49 s
(one busy CPU core).

Only the trained tokens' logprobs enter the loss, so the lm head, its softmax and the entropy run at
the positions that predict them (`logits_to_keep`), not over the prompt and tool output: on 8 such
rows (580 trained tokens of ~13k) the tiny model's step ran 1.25x faster (CPU time), packed or padded
(bench/trainer_step.py --logits-only).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from trainer.packing import Batch

SHARED_PREFIX_MIN_TOKENS = 64
"""A common prefix shorter than this is recomputed per row: the second pass would not pay for itself."""


@dataclass
class TokenLogprobs:
    logps: torch.Tensor
    """(B, T) log pi(token t | tokens < t), aligned with input_ids, at the trained tokens (loss_mask);
    0 elsewhere: only a trained token's logprob enters the loss, so no other is computed."""
    entropy: torch.Tensor | None
    """(B, T) entropy of the distribution predicting each trained token (no grad), same alignment, 0
    elsewhere; None unless asked."""


def token_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0, with_entropy: bool = False
) -> TokenLogprobs:
    prefix = shared_prefix_length(batch)
    cache_arg = _cache_argument(model) if prefix else None
    if cache_arg is not None:
        return _with_shared_prefix(model, batch, prefix, cache_arg, temperature, with_entropy)
    kwargs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    if batch.attention_mask is not None:
        kwargs["attention_mask"] = batch.attention_mask
    targets = _trained_positions(batch, 1)
    # Token t is predicted at t - 1, which lies in t's own row: a row's first token is never trained.
    if "logits_to_keep" in inspect.signature(getattr(model, "module", model).forward).parameters:
        logits = model(**kwargs, logits_to_keep=targets - 1).logits  # DDP passes the keyword on
    else:
        logits = model(**kwargs).logits[:, targets - 1]
    return _from_logits(logits, batch, targets, temperature, with_entropy)


def _trained_positions(batch: Batch, start: int) -> torch.Tensor:
    """(K,) the positions from `start` on whose token some row trains: one set for all the rows of a
    padded batch, as `logits_to_keep` takes it (its 2-D forms are transformers 5's only)."""
    return torch.nonzero(batch.loss_mask[:, start:].bool().any(0)).squeeze(1) + start


def _from_logits(
    logits: torch.Tensor, batch: Batch, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> TokenLogprobs:
    """Logprobs (and entropies) of the tokens at `targets` under `logits` (B, K, vocab), which predict
    them, laid out as (B, T) with 0 wherever a token is not trained."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    trained = batch.loss_mask[:, targets]
    picked = log_probs.gather(-1, batch.input_ids[:, targets].unsqueeze(-1)).squeeze(-1) * trained
    logps = picked.new_zeros(batch.input_ids.shape).index_copy(1, targets, picked)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            ent = -(log_probs.exp() * log_probs).sum(-1) * trained
            entropy = ent.new_zeros(batch.input_ids.shape).index_copy(1, targets, ent)
    return TokenLogprobs(logps, entropy)


def shared_prefix_length(batch: Batch) -> int:
    """How many leading tokens every row of a padded batch has in common, stopping at the first trained
    token (whose logprob needs the rows apart); 0 when that is under SHARED_PREFIX_MIN_TOKENS."""
    if batch.attention_mask is None or batch.input_ids.shape[0] < 2:
        return 0
    ids = batch.input_ids
    common = (ids == ids[:1]).all(0) & batch.attention_mask.bool().all(0)
    trained = batch.loss_mask.bool().any(0)
    stops = torch.nonzero(~common | trained)
    length = int(stops[0, 0]) if len(stops) else ids.shape[1]
    length = min(length, ids.shape[1] - 1)  # at least one token past the prefix
    return length if length >= SHARED_PREFIX_MIN_TOKENS else 0


def _cache_argument(model: torch.nn.Module) -> str | None:
    """The keyword a Hugging Face causal LM takes its key/value cache under (`cache` in transformers 5,
    `past_key_values` before), or None when the prefix cannot be shared: a wrapped model (DDP, FSDP2)
    whose forward must run once per backward, gradient checkpointing (which turns the cache off), or a
    model without `logits_to_keep`."""
    checkpointing = getattr(model, "is_activation_checkpointing", None)  # transformers 5 renamed it
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if checkpointing:
        return None
    params = inspect.signature(model.forward).parameters
    if "logits_to_keep" not in params:
        return None
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def _with_shared_prefix(
    model: torch.nn.Module, batch: Batch, prefix: int, cache_arg: str, temperature: float, with_entropy: bool
) -> TokenLogprobs:
    rows = batch.input_ids.shape[0]
    head = model(
        input_ids=batch.input_ids[:1, :prefix], position_ids=batch.position_ids[:1, :prefix],
        use_cache=True, logits_to_keep=1,
    )  # fmt: skip
    cache = getattr(head, "cache", None) or head.past_key_values
    cache.batch_repeat_interleave(rows)  # the same keys and values (and their gradient paths) per row
    targets = _trained_positions(batch, prefix + 1)  # past the prefix's own last position
    tail = model(
        input_ids=batch.input_ids[:, prefix:], position_ids=batch.position_ids[:, prefix:],
        attention_mask=batch.attention_mask, use_cache=True, logits_to_keep=targets - 1 - prefix,
        **{cache_arg: cache},
    )  # fmt: skip
    # Token t is predicted at t-1: the prefix's last position predicts the first token past it.
    logits = torch.cat([head.logits.expand(rows, -1, -1), tail.logits], dim=1)
    targets = torch.cat([targets.new_tensor([prefix]), targets])
    return _from_logits(logits, batch, targets, temperature, with_entropy)
