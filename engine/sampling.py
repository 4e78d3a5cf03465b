"""Sampling: turn one row of logits into a token and its processed logprobs.

Logprobs are vLLM's `processed_logprobs`: the log-softmax of the logits after temperature and after
top-k / top-p / min-p filtering (filtered tokens get -inf). With the proxy's train-session policy
(top_p=1, top_k=-1, min_p=0) that is exactly `log_softmax(logits / temperature)`, which the trainer
recomputes. Temperature 0 means greedy; its logprobs are those of the unscaled logits, as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GREEDY_EPS = 1e-5


@dataclass
class SamplingSettings:
    """Per-request sampling parameters, already validated by the server."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 (or 0) disables top-k."""
    min_p: float = 0.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    seed: int | None = None
    logprobs: int | None = None
    """How many top alternatives to report per token; None reports no logprobs at all."""

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def processed_logprobs(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Log-probabilities of one row of logits after temperature and truncation (float32)."""
    scores = logits.float()
    if not settings.greedy:
        scores = scores / settings.temperature
    if 0 < settings.top_k < scores.shape[-1]:
        kth = torch.topk(scores, settings.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if settings.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop_sorted = (cumulative - torch.softmax(sorted_scores, dim=-1)) >= settings.top_p
        drop_sorted[0] = False
        scores = scores.masked_fill(
            torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted), float("-inf")
        )
    if settings.min_p > 0.0:
        probs = torch.softmax(scores, dim=-1)
        scores = scores.masked_fill(probs < settings.min_p * probs.max(), float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def sample(logprobs: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None) -> int:
    """Draw one token id from processed logprobs (argmax when greedy).

    Sampling inverts the CDF with one uniform draw: exact, and much cheaper on CPU than
    torch.multinomial or an exponential race, which draw one random number per vocabulary entry.
    """
    if settings.greedy:
        return int(torch.argmax(logprobs))
    cdf = torch.cumsum(logprobs.double().exp(), dim=-1)
    u = torch.rand(1, generator=generator, dtype=torch.float64) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))
    return min(token, logprobs.shape[-1] - 1)


def top_alternatives(logprobs: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The `n` most likely (token id, logprob) pairs, most likely first."""
    if n <= 0:
        return []
    values, ids = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    return list(zip(ids.tolist(), values.tolist(), strict=True))
