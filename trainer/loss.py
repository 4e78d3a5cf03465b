"""Decoupled PPO loss with truncated importance sampling (docs/design.md 3.9).

Per trained token, with A the rollout's advantage:
    r = exp(logp_theta - logp_prox)                     policy change since the batch started
    w = exp(logp_prox - logp_behavior)                  engine-vs-trainer mismatch, corrected by `mode`
    loss = sum(-w * min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)) / num_trained_tokens
Modes: `token_truncate` clamps w to [w_min, w_max]; `token_mask` zeroes tokens whose w lies outside;
`sequence_truncate` / `sequence_mask` do the same with one w per row, exp of the row's summed log-ratio;
`none` sets w = 1 and uses the behaviour logprobs as logp_prox (TRL's async trainer).
w carries no gradient: it is a weight, not part of the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import ImportanceSamplingMode


@dataclass(frozen=True)
class LossSettings:
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    mode: ImportanceSamplingMode = "token_truncate"
    w_min: float = 0.0
    w_max: float = 3.0

    @classmethod
    def from_config(cls, config) -> LossSettings:
        return cls(
            epsilon=config.epsilon,
            epsilon_high=config.clip_high,
            mode=config.importance_sampling_mode,
            w_min=config.importance_sampling_min,
            w_max=config.importance_sampling_max,
        )


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Summed over this batch's trained tokens and divided by `num_tokens` (the step's trained tokens)."""
    sums: dict[str, float]
    """Metric numerators over this batch's trained tokens; divide by the trained-token count to average."""


def importance_weights(
    prox_logps: torch.Tensor,
    behavior_logps: torch.Tensor,
    mask: torch.Tensor,
    sequence_ids: torch.Tensor,
    num_sequences: int,
    settings: LossSettings,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w per token, 1.0 where w was truncated or masked). Inputs are (N,) over the same positions."""
    if settings.mode == "none":
        return torch.ones_like(prox_logps), torch.zeros_like(prox_logps)
    log_ratio = (prox_logps - behavior_logps) * mask
    if settings.mode.startswith("sequence"):
        per_seq = torch.zeros(num_sequences, dtype=log_ratio.dtype, device=log_ratio.device)
        valid = sequence_ids >= 0
        per_seq.index_add_(0, sequence_ids[valid], log_ratio[valid])
        log_ratio = torch.where(valid, per_seq[sequence_ids.clamp(min=0)], torch.zeros_like(log_ratio))
    raw = torch.exp(log_ratio)
    outside = (raw < settings.w_min) | (raw > settings.w_max)
    if settings.mode.endswith("truncate"):
        w = raw.clamp(min=settings.w_min, max=settings.w_max)
    else:
        w = torch.where(outside, torch.zeros_like(raw), raw)
    return w, outside.to(raw.dtype)


def grpo_loss(
    logps: torch.Tensor,
    prox_logps: torch.Tensor | None,
    behavior_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    sequence_ids: torch.Tensor,
    num_sequences: int,
    num_tokens: int,
    settings: LossSettings,
) -> LossOutput:
    """The loss of one micro-batch. Tensors of any shape, all the same; `prox_logps` is ignored (and may
    be None) in mode `none`. `num_tokens` is the number of trained tokens of the whole optimizer step, so
    micro-batches add up to the step's per-token mean."""
    logps, behavior_logps, advantages, mask, sequence_ids = (
        t.reshape(-1) for t in (logps, behavior_logps, advantages, mask, sequence_ids)
    )
    if settings.mode == "none":
        prox = behavior_logps
    else:
        if prox_logps is None:
            raise ValueError(f"importance_sampling_mode {settings.mode!r} needs the proximal logprobs")
        prox = prox_logps.reshape(-1).detach()
    w, corrected = importance_weights(prox, behavior_logps, mask, sequence_ids, num_sequences, settings)
    ratio = torch.exp((logps - prox) * mask)
    clipped = ratio.clamp(1 - settings.epsilon, 1 + settings.epsilon_high)
    per_token = -w.detach() * torch.minimum(ratio * advantages, clipped * advantages)
    loss = (per_token * mask).sum() / max(num_tokens, 1)

    with torch.no_grad():
        # k3 estimator of KL(behaviour || proximal), sampled under the behaviour policy: >= 0, unbiased.
        delta = (prox - behavior_logps) * mask
        kl = torch.exp(delta) - delta - 1
        low = (ratio < 1 - settings.epsilon) & (advantages < 0)
        high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
        sums = {
            "kl": float((kl * mask).sum()),
            "ratio": float((ratio * mask).sum()),
            "clip_ratio/low_mean": float((low * mask).sum()),
            "clip_ratio/high_mean": float((high * mask).sum()),
            "clip_ratio/region_mean": float(((low | high) * mask).sum()),
            "clip_ratio/importance_sampling": float((corrected * mask).sum()),
            "importance_sampling/weight_mean": float((w * mask).sum()),
        }
    return LossOutput(loss, sums)
