"""Automatic prefix caching in the embedded engine: an agent's later call reuses its earlier prompt's
keys and values, its logprobs stay those of a full forward pass, and new weights empty the cache."""

from __future__ import annotations

import os

import httpx
import openai
import pytest
import torch
from typer.testing import CliRunner

from engine.config import EngineConfig, load_engine
from engine.prefix_cache import BLOCK_SIZE, PrefixCache, block_keys
from harbor_rl.cli import app
from tests.engine.test_openai_api import IDS, TOOLS, recompute

SYSTEM = "You are a coding agent. Run one bash command per turn and read its output. " * 6


def _chat(client: openai.OpenAI, messages: list[dict], seed: int):
    return client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, max_tokens=16, temperature=1.0, logprobs=True,
        seed=seed, extra_body=IDS,
    )  # fmt: skip


def test_a_later_turn_reuses_the_first_prompt_and_keeps_exact_logprobs(fresh_engine, reference):
    cache = fresh_engine.scheduler.prefix_cache
    assert cache is not None and len(cache) == 0  # on by default, as in vLLM
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix calc.py."}]
    with openai.OpenAI(base_url=fresh_engine.v1, api_key="unused", max_retries=0) as client:
        first = _chat(client, messages, seed=1)
        first_prompt = first.model_extra["prompt_token_ids"]
        assert cache.hits == 0 and len(cache) == 1
        # The agent's next call resends the conversation with the reply and the tool's output.
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or "ls"},
            {"role": "user", "content": "calc.py\ntest_calc.py"},
        ]
        second = _chat(client, messages, seed=2)
    prompt = second.model_extra["prompt_token_ids"]
    shared = len(os.path.commonprefix([first_prompt, prompt]))
    assert shared >= 4 * BLOCK_SIZE
    assert cache.hits == shared // BLOCK_SIZE * BLOCK_SIZE  # every whole block the two prompts share
    assert cache.queries == len(first_prompt) + len(prompt)
    completion = second.choices[0].model_extra["token_ids"]
    sampled = [e.logprob for e in second.choices[0].logprobs.content]
    assert sampled == pytest.approx(recompute(reference, prompt, completion, 1.0), abs=1e-5)


def test_new_weights_and_the_reset_routes_empty_the_cache(fresh_engine):
    scheduler = fresh_engine.scheduler
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}]
    with openai.OpenAI(base_url=fresh_engine.v1, api_key="unused", max_retries=0) as client:
        _chat(client, messages, seed=1)
        assert len(scheduler.prefix_cache) == 1
        scheduler.apply_weights(lambda model: None)  # what /update_weights runs between steps
        assert len(scheduler.prefix_cache) == 0 and scheduler.prefix_cache.nbytes == 0
        _chat(client, messages, seed=1)
        assert len(scheduler.prefix_cache) == 1
        assert httpx.post(f"{fresh_engine.url}/reset_prefix_cache").status_code == 200
        assert len(scheduler.prefix_cache) == 0
        _chat(client, messages, seed=1)
    # vLLM's /pause empties it unless told clear_cache=false.
    assert httpx.post(f"{fresh_engine.url}/pause", params={"mode": "keep", "clear_cache": "false"}).is_success
    assert len(scheduler.prefix_cache) == 1
    assert httpx.post(f"{fresh_engine.url}/pause", params={"mode": "keep"}).is_success
    assert len(scheduler.prefix_cache) == 0
    assert httpx.post(f"{fresh_engine.url}/resume").is_success


def test_prefix_caching_can_be_turned_off(tiny_dir):
    state = load_engine(EngineConfig(model=str(tiny_dir), enable_prefix_caching=False))
    assert state.scheduler.prefix_cache is None
    # vLLM's flag pair on `harbor engine`.
    help_text = CliRunner().invoke(app, ["engine", "--help"], env={"COLUMNS": "200"}).output
    assert "--enable-prefix-caching" in help_text and "--no-enable-prefix-caching" in help_text


def _kv(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, 2, length, 4), float(length)), torch.zeros(1, 2, length, 4))]


def test_lookup_never_covers_the_last_token_nor_a_partial_block():
    cache = PrefixCache(max_bytes=10**9)
    prompt = list(range(40))
    cache.store(prompt, _kv(40), cached=0)
    length, kv = cache.lookup(prompt)  # the same prompt again: its last token is still prefilled
    assert length == 32 and kv[0][0].shape == (1, 2, 32, 4)
    assert cache.lookup(prompt[:33])[0] == 32
    assert cache.lookup(prompt[:32])[0] == 16
    assert cache.lookup([99, *prompt[1:]]) == (0, None)  # the chain breaks at the first block
    assert cache.lookup(prompt[:16] + [99] * 20)[0] == 16


def test_a_hash_collision_serves_nothing(monkeypatch):
    cache = PrefixCache(max_bytes=10**9)
    cache.store(list(range(40)), _kv(40), cached=0)
    monkeypatch.setattr(
        "engine.prefix_cache.block_keys", lambda tokens, size: block_keys(list(range(40)), size)
    )
    assert cache.lookup([7] * 40) == (0, None)


def test_least_recently_used_prompts_go_first_when_full():
    one = 2 * 2 * 32 * 4 * 4  # bytes of _kv(32)
    cache = PrefixCache(max_bytes=2 * one)
    a, b, c = ([n] * 32 for n in (1, 2, 3))
    cache.store(a, _kv(32), cached=0)
    cache.store(b, _kv(32), cached=0)
    assert cache.lookup(a + [0])[0] == 32  # a is now the most recently used
    cache.store(c, _kv(32), cached=0)
    assert len(cache) == 2 and cache.nbytes == 2 * one
    assert cache.lookup(b + [0]) == (0, None)
    assert cache.lookup(a + [0])[0] == 32 and cache.lookup(c + [0])[0] == 32
    cache.store(a + [0], _kv(33), cached=32)  # nothing new in whole blocks: not stored twice
    assert len(cache) == 2
