"""The embedded engine raises a temperature below 0.01 to 0.01, as vLLM does (`_MAX_TEMP` in
vllm/sampling_params.py), so both report the same processed logprobs for the same weights at any
temperature; harbor serve's engine probe and the trainer's re-score rely on that."""

from __future__ import annotations

import httpx
import pytest
import torch

from engine.protocol import MIN_TEMPERATURE, effective_temperature

pytestmark = pytest.mark.timeout(120)


def _first_token(engine, temperature: float) -> dict:
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
        "temperature": temperature, "logprobs": True, "top_logprobs": 5, "return_token_ids": True, "seed": 3,
    }  # fmt: skip
    response = httpx.post(f"{engine.v1}/chat/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def _alternatives(payload: dict) -> dict[str, float]:
    entry = payload["choices"][0]["logprobs"]["content"][0]
    return {alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]}


def test_effective_temperature_follows_vllm():
    assert effective_temperature(0.001) == MIN_TEMPERATURE == 0.01
    assert effective_temperature(1e-7) == 0.01  # raised before vLLM's greedy test (< 1e-5), so not greedy
    assert effective_temperature(0.0) == 0.0  # greedy stays greedy
    assert effective_temperature(0.7) == 0.7


def test_a_temperature_below_the_floor_samples_at_the_floor(engine, reference):
    low, floor = _first_token(engine, 0.001), _first_token(engine, MIN_TEMPERATURE)
    assert low["choices"][0]["token_ids"] == floor["choices"][0]["token_ids"]
    got = _alternatives(low)
    assert got.keys() == _alternatives(floor).keys()
    for token, logprob in _alternatives(floor).items():
        assert got[token] == pytest.approx(logprob, rel=1e-5, abs=1e-5)
    # ... and they are log_softmax(logits / 0.01) of a plain forward pass, not / 0.001.
    model, tokenizer = reference
    with torch.no_grad():
        logits = model(torch.tensor([low["prompt_token_ids"]])).logits[0, -1].float()
    # Logprob entries name tokens by their decoded text (no --return-tokens-as-token-ids here).
    ids = {tokenizer.decode([i]): i for i in range(logits.shape[-1])}
    for scale, should_match in ((MIN_TEMPERATURE, True), (0.001, False)):
        expected = torch.log_softmax(logits / scale, dim=-1)
        close = [expected[ids[t]].item() == pytest.approx(lp, rel=1e-4, abs=1e-3) for t, lp in got.items()]
        assert all(close) is should_match, (scale, got)
