"""Decoupled PPO loss with truncated importance sampling (docs/design.md 3.9).

Per trained token, with A the rollout's advantage:
    r = exp(logp_theta - logp_prox)                     policy change since the batch started
    w = exp(logp_prox - logp_behavior)                  engine-vs-trainer mismatch, corrected by `mode`
    loss = sum(-w * min(r * A, clip(r, 1 - eps, 1 + eps_high) * A)) / num_trained_tokens   (loss_type dapo)
    loss = mean over rows of (the row's sum of the same) / (the row's trained tokens)         (loss_type grpo)
Modes: `token_truncate` clamps w to [w_min, w_max]; `token_mask` zeroes tokens whose w lies outside;
`sequence_truncate` / `sequence_mask` do the same with one w per row, exp of the row's summed log-ratio;
`none` sets w = 1 and uses the behaviour logprobs as logp_prox (TRL's async trainer).
w carries no gradient: it is a weight, not part of the objective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import ImportanceSamplingMode, LossType


@dataclass(frozen=True)
class LossSettings:
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    mode: ImportanceSamplingMode = "token_truncate"
    w_min: float = 0.0
    w_max: float = 3.0
    loss_type: LossType = "dapo"

    @classmethod
    def from_config(cls, config) -> LossSettings:
        return cls(
            epsilon=config.epsilon,
            epsilon_high=config.clip_high,
            mode=config.importance_sampling_mode,
            w_min=config.importance_sampling_min,
            w_max=config.importance_sampling_max,
            loss_type=config.loss_type,
        )


@dataclass
class LossOutput:
    loss: torch.Tensor
    """This batch's share of the step's loss: its trained tokens' losses summed with their weights
    (`token_weights`), so the micro-batches of a step add up to the step's loss."""
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


def token_weights(
    mask: torch.Tensor,
    sequence_ids: torch.Tensor,
    num_sequences: int,
    num_tokens: int,
    num_rows: int,
    loss_type: LossType,
) -> torch.Tensor:
    """Each trained token's weight in the step's loss (0 on untrained ones); (N,) inputs."""
    if loss_type == "dapo":
        return mask / max(num_tokens, 1)
    if num_rows < 1:
        raise ValueError("loss_type 'grpo' needs the step's number of rows with a trained token (num_rows)")
    valid = sequence_ids >= 0
    per_row = torch.zeros(num_sequences, dtype=mask.dtype, device=mask.device)
    per_row.index_add_(0, sequence_ids[valid], mask[valid])
    row_tokens = torch.where(valid, per_row[sequence_ids.clamp(min=0)], torch.ones_like(mask))
    return mask / row_tokens.clamp(min=1) / num_rows


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
    num_rows: int = 0,
) -> LossOutput:
    """The loss of one micro-batch. Tensors of any shape, all the same; `prox_logps` is ignored (and may
    be None) in mode `none`. `num_tokens` and `num_rows` are the trained tokens and the rows with a
    trained token of the whole optimizer step (`num_rows` is needed by loss_type `grpo` only), so the
    micro-batches add up to the step's mean. A row lies whole in one micro-batch."""
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
    weights = token_weights(mask, sequence_ids, num_sequences, num_tokens, num_rows, settings.loss_type)
    loss = (per_token * weights).sum()

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
