"""Prompts stored against the session's earlier turns: exact round-trips, and the bytes it saves."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from capture_proxy.errors import TurnExists
from capture_proxy.store import AsyncTurnWriter, TraceStore
from capture_proxy.store.prefix import Base, BaseCache
from capture_proxy.store.schema import TurnRow

from .factories import growing_turns, make_session, make_turn


def _stored(store: TraceStore, session_id: str) -> list[tuple[int, int | None, int, int]]:
    """(seq, base seq, shared tokens, suffix tokens) of each stored turn."""
    with store._read() as s:
        rows = s.execute(
            select(
                TurnRow.seq,
                TurnRow.prompt_base_seq,
                TurnRow.prompt_shared_len,
                func.length(TurnRow.prompt_ids),
            )
            .where(TurnRow.session_id == session_id)
            .order_by(TurnRow.seq)
        ).all()
    return [(seq, base, shared, size // 4) for seq, base, shared, size in rows]


def test_growing_prompts_store_only_new_tokens(store):
    store.create_session(make_session("grow"))
    turns = growing_turns(12)
    for seq, turn in enumerate(turns):
        store.add_turn("grow", seq, turn)

    assert store.get_turns("grow") == turns
    stored = _stored(store, "grow")
    assert stored[0] == (0, None, 0, len(turns[0].prompt_token_ids))
    for (seq, base, shared, suffix), prev, turn in zip(stored[1:], turns[:-1], turns[1:], strict=True):
        assert (base, shared) == (seq - 1, len(prev.prompt_token_ids) + len(prev.completion_token_ids))
        assert suffix == len(turn.prompt_token_ids) - shared  # only the tool output is new


def test_rewritten_history_retries_and_unrelated_prompts(store):
    store.create_session(make_session("shapes"))
    first = make_turn(0, prompt_len=50)
    compacted = first.model_copy(update={"prompt_token_ids": first.prompt_token_ids[:10] + [7] * 30})
    compacted = compacted.model_copy(update={"loss_mask": [0] * 40 + [1] * 5})
    retry = compacted.model_copy(update={"node_id": "retry"})
    unrelated = make_turn(99, prompt_len=20)
    for seq, turn in enumerate([first, compacted, retry, unrelated]):
        store.add_turn("shapes", seq, turn)

    assert store.get_turns("shapes") == [first, compacted, retry, unrelated]
    assert [row[1:] for row in _stored(store, "shapes")] == [
        (None, 0, 50),
        (0, 10, 30),  # history rewritten after 10 tokens: shares those
        (1, 40, 0),  # the same prompt again: nothing new to store
        (None, 0, 20),  # shares nothing: stored in full
    ]


def test_a_cold_store_continues_a_session_exactly(store, store_url):
    store.create_session(make_session("handover"))
    turns = growing_turns(8, seed=3)
    for seq in range(4):
        store.add_turn("handover", seq, turns[seq])
    other = TraceStore(store_url)  # knows nothing of the session: its first turn is stored in full
    for seq in range(4, 8):
        other.add_turn("handover", seq, turns[seq])
    other.close()

    assert [base for _, base, _, _ in _stored(store, "handover")] == [None, 0, 1, 2, None, 4, 5, 6]
    assert TraceStore(store_url).get_turns("handover") == turns


def test_out_of_order_seqs_round_trip(store):
    store.create_session(make_session("shuffled"))
    turns = growing_turns(6, seed=5)
    store.add_turns([("shuffled", 3, turns[3]), ("shuffled", 1, turns[1])])
    store.add_turns([("shuffled", 0, turns[0]), ("shuffled", 5, turns[5]), ("shuffled", 2, turns[2])])
    store.add_turn("shuffled", 4, turns[4])
    assert store.get_turns("shuffled") == turns
    for seq, base, _, _ in _stored(store, "shuffled"):
        assert base is None or base < seq


def test_failed_batch_leaves_later_turns_exact(store):
    store.create_session(make_session("retry"))
    turns = growing_turns(4, seed=9)
    store.add_turn("retry", 0, turns[0])
    with pytest.raises(TurnExists):
        store.add_turns([("retry", 1, turns[1]), ("retry", 0, turns[0])])
    store.add_turn("retry", 2, turns[2])
    store.add_turn("retry", 1, turns[1])
    store.add_turn("retry", 3, turns[3])
    assert store.get_turns("retry") == turns


def test_without_a_cache_every_prompt_is_full(store_url):
    store = TraceStore(store_url, prompt_cache_mb=0)
    store.create_session(make_session("nocache"))
    turns = growing_turns(3)
    for seq, turn in enumerate(turns):
        store.add_turn("nocache", seq, turn)
    assert [base for _, base, _, _ in _stored(store, "nocache")] == [None, None, None]
    assert store.get_turns("nocache") == turns
    store.close()


async def test_concurrent_growing_sessions_through_the_writer(store):
    """Many agents at once: exact, and prompt storage linear in the session, not quadratic."""
    sessions = {f"a{i}": growing_turns(15, seed=i) for i in range(12)}
    for session_id in sessions:
        store.create_session(make_session(session_id))
    writer = AsyncTurnWriter(store)

    async def agent(session_id: str) -> None:
        for seq, turn in enumerate(sessions[session_id]):
            await writer.write(session_id, seq, turn)

    await asyncio.gather(*(agent(sid) for sid in sessions))
    await writer.aclose()
    for session_id, turns in sessions.items():
        assert store.get_turns(session_id) == turns
        stored_prompt_tokens = sum(suffix for _, _, _, suffix in _stored(store, session_id))
        earlier_completions = sum(len(t.completion_token_ids) for t in turns[:-1])
        final_context = len(turns[-1].prompt_token_ids)
        # Every token of the final context is stored once: in some prompt's suffix or as a completion.
        assert stored_prompt_tokens + earlier_completions == final_context
        assert sum(len(t.prompt_token_ids) for t in turns) > 5 * final_context


def test_base_cache_keeps_the_newest_turn_within_budget():
    cache = BaseCache(max_bytes=100)
    cache.put("a", Base(2, b"x" * 40))
    cache.put("a", Base(1, b"y" * 40))  # older than what is remembered: ignored
    assert cache.get("a") == Base(2, b"x" * 40)
    cache.put("b", Base(0, b"z" * 40))
    cache.get("a")  # a is now the most recently used
    cache.put("c", Base(0, b"w" * 40))  # over budget: evicts b
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None
    cache.put("d", Base(0, b"v" * 101))  # larger than the whole budget: not kept
    assert cache.get("d") is None
    cache.drop("a")
    assert cache.get("a") is None
