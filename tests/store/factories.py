"""Sessions and turns for the store tests."""

from __future__ import annotations

import hashlib
import random
import time
import uuid

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import SessionRecord


def make_session(session_id: str | None = None, **fields) -> SessionRecord:
    session_id = session_id or f"s-{uuid.uuid4().hex[:10]}"
    values = {
        "session_id": session_id,
        "api_key_hash": hashlib.sha256(f"key-{session_id}".encode()).hexdigest(),
        "model": "tiny-policy",
        "llm_url": "http://127.0.0.1:8000/v1",
        "created_at": time.time(),
    } | fields
    return SessionRecord(**values)


def make_turn(seq: int, *, prompt_len: int = 12, completion_len: int = 5) -> TrainingTurn:
    """A turn whose content depends on seq, so turns written in the wrong place would not compare equal."""
    prompt = [(seq * 7919 + i * 31) % 151_936 for i in range(prompt_len)]
    completion = [(seq * 104_729 + i * 17) % 151_936 for i in range(completion_len)]
    return TrainingTurn(
        node_id=f"node-{seq}",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=[-(seq + 1) / (i + 3) for i in range(completion_len)],
        loss_mask=[0] * prompt_len + [1] * completion_len,
        request={"messages": [{"role": "user", "content": f"step {seq}"}], "model": "tiny-policy"},
        response={"choices": [{"message": {"role": "assistant", "content": f"answer {seq}"}}]},
        metadata=TurnMetadata(
            policy_version=seq, finish_reason="stop", latency_s=0.25, created_at=1.5e9 + seq
        ),
    )


def growing_turns(n: int, *, seed: int = 0, system: int = 200, step: int = 40) -> list[TrainingTurn]:
    """An agent's turns: each prompt is the previous prompt + its completion + some tool output."""
    rng = random.Random(seed)
    context = [rng.randrange(151_936) for _ in range(system)]
    turns = []
    for k in range(n):
        completion = [rng.randrange(151_936) for _ in range(rng.randint(1, step))]
        turns.append(
            TrainingTurn(
                node_id=f"g{k}",
                prompt_token_ids=list(context),
                completion_token_ids=completion,
                per_token_logps=[-rng.random() * 10.0 ** -rng.randint(0, 300) for _ in completion],
                loss_mask=[0] * len(context) + [1] * len(completion),
            )
        )
        context += completion + [rng.randrange(151_936) for _ in range(rng.randint(0, step))]
    return turns
