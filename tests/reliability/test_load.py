"""Load: 64 concurrent agents x 20 turns through one capture proxy; every answered call is in the store
exactly once, in its own session, in order.

The agents are the real `openai` AsyncOpenAI client (half of them stream); the proxy and its SQLite
store are real; the engine is `engine.imitation`, a faithful local imitation of vLLM's OpenAI
server (vLLM needs a GPU). Each agent's messages carry a marker naming the agent and the turn, so a
turn recorded in the wrong session, twice, or out of order is seen.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from capture_proxy.models import SessionCreated
from tests.reliability._fixtures_input import ADMIN_KEY, MODEL, imitation, live_proxy

__all__ = ["imitation", "live_proxy"]  # fixtures used by name

pytestmark = pytest.mark.timeout(300)

AGENTS = 64
TURNS = 20


def marker(agent: int, turn: int) -> str:
    return f"agent-{agent:02d} turn-{turn:02d}"


async def run_agent(session, agent: int, stream: bool) -> list[tuple[str, str]]:
    """One agent's conversation; returns (response id, content) of every answered call, in order."""
    answered: list[tuple[str, str]] = []
    messages: list[dict] = []
    async with openai.AsyncOpenAI(
        base_url=session.base_url, api_key=session.api_key, max_retries=0, timeout=120
    ) as client:
        for turn in range(TURNS):
            messages.append({"role": "user", "content": marker(agent, turn)})
            if stream:
                chunks = [
                    c
                    async for c in await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=12, stream=True
                    )
                ]
                rid = chunks[0].id
                content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
                rid, content = reply.id, reply.choices[0].message.content or ""
            answered.append((rid, content))
            messages.append({"role": "assistant", "content": content})
    return answered


async def test_64_agents_x_20_turns_are_all_recorded_once_in_order(live_proxy):
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=live_proxy.url, headers=admin, timeout=120) as client:
        created = await asyncio.gather(
            *(
                client.post("/sessions", json={"model": MODEL, "purpose": "eval", "metadata": {"agent": i}})
                for i in range(AGENTS)
            )
        )
    assert [r.status_code for r in created] == [201] * AGENTS
    sessions = [SessionCreated.model_validate(r.json()) for r in created]
    results = await asyncio.gather(*(run_agent(s, i, stream=i % 2 == 1) for i, s in enumerate(sessions)))

    store = live_proxy.store
    for agent, (session, answered) in enumerate(zip(sessions, results, strict=True)):
        assert len(answered) == TURNS
        assert len({rid for rid, _ in answered}) == TURNS, f"agent {agent}: a response id repeats"
        record = store.get_session(session.session_id)
        assert record.metadata == {"agent": agent} and record.num_turns == TURNS
        turns = store.get_turns(session.session_id)
        assert [t.node_id for t in turns] == [f"t{i}" for i in range(TURNS)]
        for turn_index, (turn, (rid, content)) in enumerate(zip(turns, answered, strict=True)):
            where = f"agent {agent} turn {turn_index}"
            request_messages = turn.request["messages"]
            # Its own marker last, and every earlier marker of this agent only: no other session's call.
            assert request_messages[-1]["content"] == marker(agent, turn_index), where
            users = [m["content"] for m in request_messages if m["role"] == "user"]
            assert users == [marker(agent, t) for t in range(turn_index + 1)], where
            # The answer the agent got is the one stored, once.
            assert turn.response["id"] == rid, where
            assert turn.response["choices"][0]["message"]["content"] == content, where
            assert turn.metadata.capture == "ok" and turn.metadata.streamed == (agent % 2 == 1), where

    # The validated trace of every session reads back (no FATAL finding).
    async with httpx.AsyncClient(base_url=live_proxy.url, headers=admin, timeout=120) as client:
        traces = await asyncio.gather(*(client.get(f"/sessions/{s.session_id}/trace") for s in sessions))
    assert [r.status_code for r in traces] == [200] * AGENTS
    assert all(len(r.json()["turns"]) == TURNS for r in traces)
