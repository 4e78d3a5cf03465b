"""Attention that knows where the packed rows begin: `sdpa` run once per row of a padding-free pack.

A packed (1, T) batch holds several rows whose position ids restart at 0. With `sdpa` (or `eager`)
transformers keeps each row to itself with a dense (T, T) block-diagonal mask, which costs (T)^2 time
and memory and, on a GPU, loses the fused causal kernel: packed steps ran 0.81x the speed of padded
ones on an H200, and 8 agent rows packed into ~13k tokens took ~40 s a step on this project's CPU
(bench/trainer_step.py). `document_sdpa` is the same `sdpa` with one change: where that mask would be
"causal within each row", the mask step hands the attention the rows' spans instead, and the attention
runs `sdpa` with `is_causal` on each row's slice, which is sum(n_i^2) work and the flash/causal kernel
on a GPU. Every other mask (padding, a key/value cache, sliding windows, anything it cannot recognise)
is built and used exactly as `sdpa` does, so the two agree wherever the rows do not share a pack.

flex_attention would do the same with a block mask on a GPU, but torch has no flex backward on the
CPU; flash-attention's varlen kernels do it from the position ids where flash-attn is installed (the
trainer leaves such models as they are).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ATTENTION = "document_sdpa"
"""The attention implementation's name in transformers' registries (`model.set_attn_implementation`)."""

DOCUMENT_AWARE = ("flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention", ATTENTION)
"""Implementations whose packed batches keep attention inside each row without a dense mask."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowSpans:
    """What the mask step passes `document_sdpa` for a pack of causal rows: each row's [start, end)."""

    spans: tuple[tuple[int, int], ...]


def row_spans(mask_function: Callable, length: int, device: torch.device | str) -> RowSpans | None:
    """The rows of a (1, length) pack whose mask is causal within each row and nothing across rows, read
    off transformers' index-based `mask_function` in O(length); None for any other pattern (a sliding
    window, a prefix, bidirectional tokens), which then gets its dense mask as before."""
    q = torch.arange(length, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)

    def sees(q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(mask_function(zero, zero, q_idx, kv_idx), device=device).expand(q_idx.shape)

    starts = torch.ones(length, dtype=torch.bool, device=device)
    starts[1:] = ~sees(q[1:], q[:-1])  # a row begins where a token cannot see the one before it
    first = q.masked_fill(~starts, 0).cummax(0).values  # each token's row start
    if not bool(sees(q, q).all() & sees(q, first).all()):  # each token sees itself and its row's start
        return None
    if length > 1 and bool(sees(q[:-1], q[1:]).any()):  # and nothing after it
        return None
    later = q[first > 0]  # tokens past the first row: blind to the previous row's last token
    if len(later) and bool(sees(later, first[later] - 1).any()):
        return None
    bounds = torch.nonzero(starts).squeeze(1).tolist() + [length]
    return RowSpans(tuple(zip(bounds[:-1], bounds[1:], strict=True)))


_warned = False


def document_sdpa_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | RowSpans | None:
    """transformers' mask step for `document_sdpa`: the rows' spans for a pack of several rows, else
    `sdpa_mask`'s own result."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask_function = mask_function or causal_mask_function
    fallback = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                    kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask)  # fmt: skip
    packed_shape = (
        batch_size == 1 and attention_mask is None and q_offset == 0 and kv_offset == 0
        and q_length == kv_length > 1 and not kwargs.get("use_vmap", False)
        and not kwargs.get("allow_is_causal_skip", True)  # transformers turns the skip off for packs
    )  # fmt: skip
    if packed_shape:
        spans = row_spans(mask_function, q_length, kwargs.get("device", "cpu"))
        if spans is not None and len(spans.spans) > 1:
            return spans
        global _warned
        if spans is None and not _warned:
            _warned = True
            log.warning("document_sdpa: a mask that is not causal rows (%s); dense sdpa mask", mask_function)
    return sdpa_mask(**fallback, **kwargs)


def document_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | RowSpans | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa` attention, once per row of a pack (causal inside each) when given RowSpans."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, RowSpans):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    parts = [
        sdpa_attention_forward(module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs)[0]
        for a, b in attention_mask.spans
    ]  # each (1, n_i, heads, head_dim)
    return torch.cat(parts, dim=1), None


def register() -> str:
    """Register `document_sdpa` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, document_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION, document_sdpa_mask)
    return ATTENTION


def attention_implementation(model: Any) -> str | None:
    """The model's transformers attention implementation, or None for a model without a config."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def use_document_attention(model: Any) -> bool:
    """Give an `sdpa` transformers model `document_sdpa`. True when the model's packed batches now keep
    attention inside each row without a dense mask (it had such an implementation already, or now has
    `document_sdpa`); False when it has none (`eager`, a custom one, not a transformers model)."""
    impl = attention_implementation(model)
    if impl in DOCUMENT_AWARE:
        return True
    if impl != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    model.set_attn_implementation(register())
    return True
