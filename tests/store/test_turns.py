"""Turns: exact round-trip, ordering, atomic batches, and how compactly tokens are stored."""

from __future__ import annotations

import math
import struct

import pytest
from sqlalchemy import func, select

from capture_proxy.errors import SessionNotFound, StoreError, TurnExists
from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store.schema import TurnRow

from .factories import make_session, make_turn

# Values that lose bits through decimal text or float32: subnormals, the smallest normal, -0.0,
# and numbers whose shortest repr needs 17 digits.
TRICKY_LOGPS = [
    -5e-324,
    -2.2250738585072014e-308,
    -1e-300,
    -0.0,
    -1.0000000000000002,
    -0.1,
    -1 / 3,
    -math.pi * 1e-12,
    -745.1332191019411,
    -math.inf,
]


def _bits(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def test_turn_round_trips_exactly(store):
    store.create_session(make_session("rt"))
    turn = TrainingTurn(
        node_id="n0",
        prompt_token_ids=[0, 1, 151_935, 2**31 - 1, 42, 7],
        completion_token_ids=list(range(100, 100 + len(TRICKY_LOGPS))),
        per_token_logps=TRICKY_LOGPS,
        loss_mask=[0, 1, 0, 1, 1, 0] + [1, 0, 1, 1, 1, 0, 0, 1, 1, 1],
        request={"messages": [{"role": "user", "content": 'héllo \x00 \u2603 "q"'}], "n": 10**15, "t": 0.7},
        response={"id": "r", "nested": {"b": [1, 2.5, None, True], "a": {}}},
        metadata=TurnMetadata(
            endpoint="completions",
            sampling={"temperature": 0.7},
            policy_version=3,
            finish_reason="length",
            latency_s=0.123456789012345,
            role="auxiliary",
            capture="token_mismatch",
            error="token 3 differs",
            streamed=True,
            created_at=1795990000.123456,
        ),
    )
    store.add_turn("rt", 0, turn)

    [back] = store.get_turns("rt")
    assert back == turn
    assert _bits(back.per_token_logps) == _bits(TRICKY_LOGPS)  # == treats -0.0 as 0.0; the bits do not
    assert list(back.request) == list(turn.request)  # key order survives too


def test_empty_arrays_round_trip(store):
    store.create_session(make_session("empty"))
    turn = TrainingTurn(
        node_id="n", prompt_token_ids=[], completion_token_ids=[], per_token_logps=[], loss_mask=[]
    )
    store.add_turn("empty", 0, turn)
    assert store.get_turns("empty") == [turn]


def test_turns_come_back_in_seq_order_and_bump_num_turns(store):
    store.create_session(make_session("ordered"))
    store.create_session(make_session("other"))
    store.add_turns([("ordered", 2, make_turn(2)), ("other", 0, make_turn(50)), ("ordered", 0, make_turn(0))])
    store.add_turn("ordered", 1, make_turn(1))

    assert store.get_turns("ordered") == [make_turn(0), make_turn(1), make_turn(2)]
    assert store.get_turns("other") == [make_turn(50)]
    assert store.get_session("ordered").num_turns == 3
    assert store.get_session("other").num_turns == 1


def test_turn_for_unknown_session_raises_and_stores_nothing(store):
    store.create_session(make_session("known"))
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.add_turns([("known", 0, make_turn(0)), ("ghost", 0, make_turn(1))])
    # The batch is one transaction: the good turn was not stored either.
    assert store.get_turns("known") == []
    assert store.get_session("known").num_turns == 0
    with pytest.raises(SessionNotFound):
        store.add_turn("ghost", 0, make_turn(0))
    with pytest.raises(SessionNotFound):
        store.get_turns("ghost")


def test_duplicate_seq_is_rejected(store):
    store.create_session(make_session("dup"))
    store.add_turn("dup", 0, make_turn(0))
    with pytest.raises(TurnExists, match="'dup' seq 0"):
        store.add_turn("dup", 0, make_turn(9))
    assert store.get_turns("dup") == [make_turn(0)]
    assert store.get_session("dup").num_turns == 1


def test_invalid_mask_names_turn_and_position(store):
    store.create_session(make_session("badmask"))
    turn = make_turn(0).model_copy(update={"loss_mask": [0, 1, 2] + [1] * 14})
    with pytest.raises(StoreError, match=r"turn 4 of session 'badmask': loss_mask\[2\] is 2"):
        store.add_turn("badmask", 4, turn)


def test_unserializable_request_is_a_store_error(store):
    store.create_session(make_session("badjson"))
    turn = make_turn(0).model_copy(update={"request": {"blob": b"\x00raw bytes"}})
    with pytest.raises(StoreError, match="cannot store a value as JSON: .*bytes"):
        store.add_turn("badjson", 0, turn)
    assert store.get_session("badjson").num_turns == 0


def test_token_arrays_are_stored_compactly(store):
    """4 bytes per token id, 8 per logprob, one bit of mask per token: far below JSON lists."""
    store.create_session(make_session("compact"))
    prompt_len, completion_len = 3000, 500
    turn = make_turn(1, prompt_len=prompt_len, completion_len=completion_len)
    store.add_turn("compact", 0, turn)

    with store._read() as s:  # the raw column sizes, as the database reports them
        sizes = s.execute(
            select(
                func.length(TurnRow.prompt_ids),
                func.length(TurnRow.completion_ids),
                func.length(TurnRow.logps),
                func.length(TurnRow.loss_mask),
            ).where(TurnRow.session_id == "compact")
        ).one()
    tokens = prompt_len + completion_len
    assert tuple(sizes) == (4 * prompt_len, 4 * completion_len, 8 * completion_len, (tokens + 7) // 8)
    binary_per_token = sum(sizes) / tokens
    json_per_token = (
        len(str(turn.prompt_token_ids + turn.completion_token_ids))
        + len(str(turn.per_token_logps))
        + len(str(turn.loss_mask))
    ) / tokens
    assert binary_per_token < 6.0
    assert binary_per_token < json_per_token / 2
