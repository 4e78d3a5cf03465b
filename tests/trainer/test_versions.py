"""Per-turn policy versions with an engine that sends none (vLLM): the trainer's ledger of its own pushes
dates every captured turn, and a turn sampled across a push is marked with both versions."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from capture_proxy.models import TrainingTrace
from trainer.versions import VersionLedger

MESSAGES = [{"role": "user", "content": "Fix the parser."}]


def test_the_ledger_answers_the_version_live_at_a_time() -> None:
    ledger = VersionLedger(initial=3)
    ledger.record(4, at=100.0)
    ledger.record(5, at=200.0)
    assert [ledger.at(t) for t in (0.0, 99.9, 100.0, 150.0, 200.0, 1e12)] == [3, 3, 4, 4, 5, 5]
    with pytest.raises(ValueError, match="before the previous push"):
        ledger.record(6, at=150.0)


def call(session, **kwargs) -> None:
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    client.chat.completions.create(model="m", messages=MESSAGES, **kwargs)


def test_turns_through_the_proxy_from_a_headerless_engine_get_the_trainers_versions(proxy, imitation):
    imitation.configure(policy_version=None)  # like vLLM: no version header on any reply
    engine = httpx.Client(base_url=imitation.url, timeout=30)
    ledger = VersionLedger(initial=0)
    session = proxy.create(sampling={"temperature": 1.0})
    call(session)  # served by the initial weights
    ledger.record(1)
    call(session)  # after the first push
    # A push while the third call is in flight, as the trainer drives vLLM: pause(keep) holds the call,
    # the weights get the trainer's tag, resume lets the call finish under them.
    assert engine.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    held = threading.Thread(target=call, args=(session,))
    held.start()
    time.sleep(0.5)
    assert held.is_alive()  # held by the pause
    assert engine.post("/start_weight_update").status_code == 200
    assert engine.post("/finish_weight_update", json={"weight_version": "2"}).status_code == 200
    ledger.record(2)
    engine.post("/resume")
    held.join(30)
    assert engine.get("/weight_info").json() == {"weight_version": "2"}

    turns = proxy.store.get_turns(session.session_id)
    assert [t.metadata.policy_version for t in turns] == [None, None, None]  # the proxy got no header
    straddling = ledger.date_turns(TrainingTrace(turns=turns))
    assert [t.metadata.policy_version for t in turns] == [0, 1, 1]
    assert [t.node_id for t in straddling] == [turns[2].node_id]
    assert turns[2].metadata.policy_version_end == 2
    assert not hasattr(turns[1].metadata, "policy_version_end")


def test_a_header_version_is_the_engines_word_and_the_ledger_leaves_it_alone(proxy, imitation):
    """The proxy stamps a turn when it records it, which on a busy host can come after a push that
    followed the engine's last token: the engine's own version is the one to believe."""
    imitation.configure(policy_version=4)  # the embedded engine's header
    session = proxy.create(sampling={"temperature": 1.0})
    call(session)
    (turn,) = proxy.store.get_turns(session.session_id)
    later = VersionLedger(initial=4)
    later.record(5, at=turn.metadata.created_at - 1e-3)  # recorded after a push the ledger knows of
    assert later.date_turns(TrainingTrace(turns=[turn])) == []
    assert turn.metadata.policy_version == 4 and not hasattr(turn.metadata, "policy_version_end")
