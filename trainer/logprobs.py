"""Per-token logprobs of a Hugging Face causal LM on a packed or padded batch, at the sampling temperature.

The engine reports vLLM's processed logprobs, `log_softmax(logits / temperature)` under the trainer's
sampling policy (top_p=1, top_k=-1), so the trainer divides by the same temperature; otherwise the
importance ratio would measure the temperature, not the policy change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.packing import Batch


@dataclass
class TokenLogprobs:
    logps: torch.Tensor
    """(B, T) log pi(token t | tokens < t), aligned with input_ids; 0 at each row's first position."""
    entropy: torch.Tensor | None
    """(B, T) entropy of the predicting distribution (no grad), same alignment; None unless asked."""


def token_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0, with_entropy: bool = False
) -> TokenLogprobs:
    kwargs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "use_cache": False}
    if batch.attention_mask is not None:
        kwargs["attention_mask"] = batch.attention_mask
    logits = model(**kwargs).logits[:, :-1].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, 1:]
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # Position t is predicted by t-1 only when both lie in the same row (packed rows sit side by side).
    same_row = (batch.sequence_ids[:, 1:] == batch.sequence_ids[:, :-1]) & (batch.sequence_ids[:, 1:] >= 0)
    zero = picked.new_zeros(picked.shape[0], 1)
    logps = torch.cat([zero, picked * same_row], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            ent = -(log_probs.exp() * log_probs).sum(-1) * same_row
            entropy = torch.cat([zero.detach(), ent], dim=1)
    return TokenLogprobs(logps, entropy)
