"""Requests stored as a message delta and responses without their arrays: exact round trips, the
shapes that must be stored as sent, and rows written before revision 0004 read as they were."""

from __future__ import annotations

import orjson
import pytest
import sqlalchemy as sa
from alembic import command

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import TraceStore, codec, compact
from capture_proxy.store.compact import Elided, elide_response, restore_response
from capture_proxy.store.engine import create_store_engine
from capture_proxy.store.migrate import alembic_config

from .factories import make_session

PROMPT, COMPLETION, LOGPS = [5, 6, 7], [8, 9], [-0.5, -0.0]


def chat_reply(**choice_fields) -> dict:
    content = [
        {"token": f"token_id:{t}", "logprob": lp, "bytes": [1], "top_logprobs": []}
        for t, lp in zip(COMPLETION, LOGPS, strict=True)
    ]
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": {"content": content},
              "finish_reason": "stop", "token_ids": list(COMPLETION)} | choice_fields  # fmt: skip
    return {"id": "c", "choices": [choice], "usage": {"prompt_tokens": 3}, "prompt_token_ids": list(PROMPT)}


def roundtrip(response: dict) -> tuple[dict, int, dict]:
    stored, flags = elide_response(response, PROMPT, COMPLETION, LOGPS)
    back = restore_response(orjson.loads(orjson.dumps(stored)), flags, PROMPT, COMPLETION, LOGPS)
    return stored, flags, back


def test_a_vllm_reply_keeps_only_what_the_arrays_do_not_hold():
    reply = chat_reply()
    stored, flags, back = roundtrip(reply)
    assert Elided(flags) == Elided.PROMPT_IDS | Elided.COMPLETION_IDS | Elided.CHAT_LOGPROBS
    assert stored["prompt_token_ids"] is None and stored["choices"][0]["token_ids"] is None
    assert stored["choices"][0]["logprobs"]["content"] == [{"bytes": [1], "top_logprobs": []}] * 2
    assert orjson.dumps(back) == orjson.dumps(reply)
    assert reply == chat_reply()  # the caller's reply is left as it was


@pytest.mark.parametrize(
    "reply",
    [
        chat_reply(token_ids=[8, 10]),  # not the captured ids
        chat_reply(token_ids=[8.0, 9]),  # equal as numbers, not as JSON
        chat_reply(
            logprobs={
                "content": [
                    {"logprob": -0.5, "token": "token_id:8"},
                    {"token": "token_id:9", "logprob": -0.0},
                ]
            }
        ),
        chat_reply(
            logprobs={
                "content": [{"token": "token_id:8", "logprob": -0.5}, {"token": "token_id:9", "logprob": 0.0}]
            }
        ),
        chat_reply(logprobs={"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.0}]}),
        {**chat_reply(), "prompt_token_ids": [5, 6, True]},
    ],
    ids=["other-ids", "float-ids", "key-order", "signed-zero", "text-tokens", "bool-id"],
)
def test_what_cannot_be_rebuilt_exactly_is_stored_as_sent(reply):
    _, _, back = roundtrip(reply)
    assert orjson.dumps(back) == orjson.dumps(reply)


def test_bytes_that_are_the_tokens_utf8_are_rebuilt_too():
    content = [{"token": f"token_id:{t}", "logprob": lp, "bytes": list(f"token_id:{t}".encode()), "top_logprobs": []}
               for t, lp in zip(COMPLETION, LOGPS, strict=True)]  # fmt: skip
    reply = chat_reply(logprobs={"content": content})
    stored, flags, back = roundtrip(reply)
    assert Elided.CHAT_BYTES in Elided(flags)
    assert stored["choices"][0]["logprobs"]["content"] == [{"top_logprobs": []}] * 2
    assert orjson.dumps(back) == orjson.dumps(reply)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"top_logprobs": []},
        {"bytes": [1], "top_logprobs": []},
        {"bytes": [1], "top_logprobs": [], "x": 1},
    ],
    ids=["nothing", "top", "bytes-top", "three"],
)
def test_entries_of_one_shape_keep_exactly_what_follows_token_and_logprob(extra):
    content = [
        {"token": f"token_id:{t}", "logprob": lp, **extra} for t, lp in zip(COMPLETION, LOGPS, strict=True)
    ]
    reply = chat_reply(logprobs={"content": content})
    stored, flags, back = roundtrip(reply)
    assert Elided.CHAT_LOGPROBS in Elided(flags)
    assert stored["choices"][0]["logprobs"]["content"] == [extra] * 2
    assert orjson.dumps(back) == orjson.dumps(reply)


def test_a_text_completion_reply_round_trips():
    reply = {"choices": [{"index": 0, "text": "hi", "prompt_token_ids": list(PROMPT), "token_ids": list(COMPLETION),
             "logprobs": {"tokens": ["token_id:8", "token_id:9"], "token_logprobs": list(LOGPS), "top_logprobs": None}}]}  # fmt: skip
    stored, flags, back = roundtrip(reply)
    assert Elided(flags) == (
        Elided.CHOICE_PROMPT_IDS | Elided.COMPLETION_IDS | Elided.TEXT_LOGPROBS | Elided.TEXT_TOKENS
    )
    assert orjson.dumps(back) == orjson.dumps(reply)


def turn(seq: int, messages: list[dict], response: dict | None = None) -> TrainingTurn:
    n = 3 + seq
    return TrainingTurn(
        node_id=f"t{seq}", prompt_token_ids=list(range(n)), completion_token_ids=[n], per_token_logps=[-1.0],
        loss_mask=[0] * n + [1], request={"model": "m", "messages": messages, "temperature": 1},
        response=response or {"choices": [{"message": {"content": f"a{seq}"}}]},
        metadata=TurnMetadata(created_at=1.0),
    )  # fmt: skip


def test_messages_are_shared_only_when_their_json_is_the_same(store):
    store.create_session(make_session("s"))
    first = [{"role": "user", "content": "go", "n": 1}]
    turns = [
        turn(0, first),
        turn(1, [*first, {"role": "assistant", "content": "ok"}]),
        turn(2, [{"role": "user", "content": "go", "n": 1.0}, {"role": "assistant", "content": "ok"}]),
        turn(3, [{"role": "user", "content": "go", "n": True}]),
    ]
    for seq, t in enumerate(turns):
        store.add_turn("s", seq, t)
    back = store.get_turns("s")
    assert [orjson.dumps(t.request) for t in back] == [orjson.dumps(t.request) for t in turns]
    with store._engine.connect() as conn:
        shared = conn.execute(sa.text("SELECT request_shared FROM turns ORDER BY seq")).scalars().all()
    assert shared == [0, 1, 0, 0]
    back[1].request["messages"][0]["content"] = "changed"  # each turn read back owns its objects
    assert back[2].request["messages"][0]["content"] == "go"


@pytest.mark.parametrize(
    ("base", "mine", "shared"),
    [
        ([{"a": 1}], [{"a": 1}, {"b": 2}], 1),  # the usual turn: the history extended
        ([{"a": 1}, {"b": 2}], [{"a": 1}, {"b": 2}], 2),  # resent as it was
        ([1], [12, 1], 0),  # a number whose text begins the other's
        (["a"], ['a","b'], 0),  # a string whose text begins the other's
        ([{"a": 1}, {"b": 2}, {"c": 3}], [{"a": 1}, {"x": 0}, {"c": 3}], 1),  # an edited history
        ([{"a": 1}, {"b": 2}], [{"a": 1}], 1),  # a compacted one
        ([{"a": 1.0}], [{"a": 1}, {"b": 2}], 0),  # equal as numbers, not as JSON
        ([], [{"a": 1}], 0),
    ],
)
def test_shared_messages_counts_the_leading_messages_with_the_same_json(base, mine, shared):
    assert (
        compact.shared_messages(
            compact.messages_of({"messages": mine}), compact.messages_of({"messages": base})
        )
        == shared
    )


def test_a_compacted_history_shares_what_it_kept(store):
    store.create_session(make_session("s"))
    system = {"role": "system", "content": "be brief"}
    turns = [
        turn(0, [system, {"role": "user", "content": "one"}]),
        turn(1, [system, {"role": "user", "content": "one"}, {"role": "assistant", "content": "1"}]),
        turn(2, [system, {"role": "user", "content": "summary of one"}]),  # the agent compacted
        turn(
            3, [system, {"role": "user", "content": "summary of one"}, {"role": "assistant", "content": "2"}]
        ),
    ]
    for seq, t in enumerate(turns):
        store.add_turn("s", seq, t)
    assert [orjson.dumps(t.request) for t in store.get_turns("s")] == [orjson.dumps(t.request) for t in turns]
    with store._engine.connect() as conn:
        shared = conn.execute(sa.text("SELECT request_shared FROM turns ORDER BY seq")).scalars().all()
    assert shared == [0, 2, 1, 2]


def test_rows_written_before_0004_read_back_unchanged(store_url):
    engine = create_store_engine(store_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0003")
        reply = chat_reply()
        old = [turn(0, [{"role": "user", "content": "go"}], reply),
               turn(1, [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}], reply)]  # fmt: skip
        with engine.begin() as conn:
            sessions = sa.Table("sessions", sa.MetaData(), autoload_with=conn)
            turns = sa.Table("turns", sa.MetaData(), autoload_with=conn)
            assert "request_shared" not in turns.c
            conn.execute(sessions.insert(), [{
                **make_session("old").model_dump(exclude={"metadata"}), "metadata": {}, "num_turns": 2,
            }])  # fmt: skip
            conn.execute(turns.insert(), [{
                "session_id": "old", "seq": seq, "node_id": t.node_id, "prompt_base_seq": None,
                "prompt_shared_len": 0, "prompt_ids": codec.encode_ids(t.prompt_token_ids),
                "completion_ids": codec.encode_ids(t.completion_token_ids),
                "logps": codec.encode_logps(t.per_token_logps), "loss_mask": codec.encode_mask(t.loss_mask),
                "request": t.request, "response": t.response, "metadata": t.metadata.model_dump(),
            } for seq, t in enumerate(old)])  # fmt: skip
    finally:
        engine.dispose()
    store = TraceStore(store_url)  # migrates to 0004
    try:
        assert [t.model_dump() for t in store.get_turns("old")] == [t.model_dump() for t in old]
        store.add_turn("old", 2, turn(2, [*old[1].request["messages"], {"role": "user", "content": "more"}]))
        back = store.get_turns("old")
        assert back[2].request["messages"][-1] == {"role": "user", "content": "more"}
        assert len(back[2].request["messages"]) == 3
    finally:
        store.close()
