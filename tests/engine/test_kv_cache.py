"""The running batch's cache appends in place (engine.kv_cache.GrowingLayer) and changes nothing: the
same seeded requests give the same tokens and logprobs as with transformers' own concatenating cache,
through sequences joining, finishing and outgrowing the room made for them."""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine import kv_cache, scheduler
from engine.config import EngineConfig, load_engine
from engine.sampling import SamplingSettings


def _drain(seq) -> list[tuple[int, float]]:
    """The (token, logprob) pairs a sequence has handed over."""
    events = []
    while not seq.queue.empty():
        event = seq.queue.get_nowait()
        events.append((event.token_id, event.logprob))
    return events


def _generate(tiny_dir) -> list[list[tuple[int, float]]]:
    """Six seeded sequences of different lengths, admitted two per step while others decode."""
    state = load_engine(EngineConfig(model=str(tiny_dir), max_model_len=1024))
    engine = state.scheduler
    prompts = [[10 + i, *range(40, 40 + 17 * (i + 1))] for i in range(6)]

    async def run() -> list[list[tuple[int, float]]]:
        loop = asyncio.get_running_loop()
        seqs = [
            scheduler.Sequence(
                prompt,
                SamplingSettings(max_tokens=30 + 25 * i, ignore_eos=True, seed=i, logprobs=0),
                loop,
            )
            for i, prompt in enumerate(prompts)
        ]
        with torch.inference_mode():
            for start in range(0, len(seqs), 2):
                engine._step(seqs[start : start + 2])
            while engine._rows:
                engine._decode()
        await asyncio.sleep(0)  # the events arrive through call_soon_threadsafe
        return [_drain(seq) for seq in seqs]

    return asyncio.run(run())


def test_growing_cache_matches_concatenation(tiny_dir, monkeypatch) -> None:
    torch.set_num_threads(1)
    grown = _generate(tiny_dir)
    monkeypatch.setattr(scheduler, "growing_cache", lambda kv, room: kv_cache.make_cache(kv))
    concatenated = _generate(tiny_dir)
    assert [len(e) for e in grown] == [30 + 25 * i for i in range(6)]  # up to 155: past the first room
    assert grown == concatenated


def test_a_layer_grows_by_copying_and_then_appends_in_place() -> None:
    keys = torch.randn(2, 2, 5, 4)
    values = torch.randn(2, 2, 5, 4)
    cache = kv_cache.growing_cache([(keys, values)], None)
    step = torch.randn(2, 2, 1, 4)
    k, v = cache.layers[0].update(step, step * 2)
    assert torch.equal(k, torch.cat([keys, step], dim=-2)) and torch.equal(v, torch.cat([values, step * 2], dim=-2))
    (_, room), = [kv_cache.cache_tensors(cache)[1][0]]
    assert room.shape[-2] == 6 + kv_cache.GROWTH_TOKENS
    kv, rooms = kv_cache.cache_tensors(cache)
    again = kv_cache.growing_cache(kv, rooms)
    k2, _ = again.layers[0].update(step, step)
    assert k2.data_ptr() == rooms[0][0].data_ptr()  # written into the same buffer, nothing copied
    assert k2.shape[-2] == 7 and torch.equal(k2[..., 5:6, :], step)


def test_sequences_sent_the_same_prompt_together_share_one_prefill(tiny_dir, monkeypatch) -> None:
    """A group's rollouts send one prompt at once: one prefill serves them all (each draws its own first
    token), and what they sample is what separate prefills gave them."""
    state = load_engine(EngineConfig(model=str(tiny_dir), max_model_len=1024, enable_prefix_caching=False))
    engine = state.scheduler
    forwards = []
    real_forward = engine._forward

    def counting(ids, cache, **kwargs):
        forwards.append(tuple(ids.shape))
        return real_forward(ids, cache, **kwargs)

    monkeypatch.setattr(engine, "_forward", counting)

    def run(group) -> list[list[tuple[int, float]]]:
        async def go():
            loop = asyncio.get_running_loop()
            prompt = list(range(40, 90))
            seqs = [
                scheduler.Sequence(list(prompt), SamplingSettings(max_tokens=12, ignore_eos=True, seed=i, logprobs=0), loop)
                for i in range(4)
            ]
            with torch.inference_mode():
                engine._step(seqs)
                while engine._rows:
                    engine._decode()
            await asyncio.sleep(0)
            return [_drain(seq) for seq in seqs]

        monkeypatch.setattr(scheduler, "_by_prompt", group)
        forwards.clear()
        return asyncio.run(go())

    shared = run(scheduler._by_prompt)
    prefills = [shape for shape in forwards if shape[1] > 1]
    separate = run(lambda seqs: [[seq] for seq in seqs])
    assert prefills == [(1, 50)]  # one prefill for the four
    assert [len(s) for s in shared] == [12] * 4 and len({tuple(s) for s in shared}) == 4  # each its own draws
    assert [[t for t, _ in s] for s in shared] == [[t for t, _ in s] for s in separate]
    for got, want in zip(shared, separate, strict=True):
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in want], abs=1e-5)

