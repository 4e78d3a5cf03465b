"""Trace store ingest: turns/s and bytes per token, SQLite and PostgreSQL against plain JSONL.

Every backend stores the same synthetic agent sessions, whose contexts grow turn by turn as a coding
agent's do (system prompt, then completion + tool output appended each turn). Writes go through
the proxy's turn writer (`turn_writer`: on the event loop for SQLite, a writer thread for
PostgreSQL) with all sessions writing at once, as the proxy does; JSONL appends one line per turn
and flushes it (the same crash guarantee as SQLite's WAL with synchronous=NORMAL: a process crash
loses nothing written, a power cut may lose the last moments). Reads load every session's turns back
as TrainingTurn objects.

    python bench/store_ingest.py [--quick] [--sessions N] [--turns T]

Then one 50-turn rollout whose history grows every turn, shaped as the proxy records it (the agent
asked for token ids and logprobs, so the reply carries the prompt ids and a logprob entry per token):
the bytes each turn's row takes, per tenth of the rollout, against the same turn stored in full. A
turn costs what is new in it when the last tenth's rows are no bigger than the first's.

PostgreSQL runs when HARBOR_TEST_POSTGRES_URL is set, in a scratch schema dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import SessionRecord, TraceStore, turn_writer
from capture_proxy.store.schema import TurnRow

VOCAB = 151_936
CHARS_PER_TOKEN = 4  # request/response text is about this long per token


@dataclass
class Workload:
    sessions: list[list[TrainingTurn]]

    @property
    def turns(self) -> int:
        return sum(len(s) for s in self.sessions)

    @property
    def tokens(self) -> int:
        return sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for s in self.sessions for t in s)


@dataclass
class Result:
    name: str
    write_s: float
    read_s: float
    nbytes: int
    array_bytes: int
    """Bytes of the token ids, logprobs and masks alone (JSON lists in JSONL, binary columns in a DB)."""


def _text(rng: np.random.Generator, tokens: int) -> str:
    return "".join(rng.choice(list("abcdefghij klmnop\n"), size=tokens * CHARS_PER_TOKEN))


def make_workload(n_sessions: int, n_turns: int, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    sessions = []
    for _ in range(n_sessions):
        context = rng.integers(0, VOCAB, 1000).tolist()  # system prompt + task
        messages = [{"role": "system", "content": _text(rng, 1000)}]
        turns = []
        for k in range(n_turns):
            completion = rng.integers(0, VOCAB, int(rng.integers(50, 300))).tolist()
            answer = _text(rng, len(completion))
            turns.append(
                TrainingTurn(
                    node_id=f"n{k}",
                    prompt_token_ids=list(context),
                    completion_token_ids=completion,
                    per_token_logps=(-rng.exponential(0.5, len(completion))).tolist(),
                    loss_mask=[0] * len(context) + [1] * len(completion),
                    request={"model": "policy", "messages": list(messages), "temperature": 1.0},
                    response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
                    metadata=TurnMetadata(
                        policy_version=3, finish_reason="stop", latency_s=0.8, created_at=time.time()
                    ),
                )
            )
            tool_output = rng.integers(0, VOCAB, int(rng.integers(50, 300))).tolist()
            context += completion + tool_output
            messages += [
                {"role": "assistant", "content": answer},
                {"role": "tool", "content": _text(rng, len(tool_output))},
            ]
        sessions.append(turns)
    return Workload(sessions)


def bench_jsonl(work: Workload, folder: Path) -> Result:
    path = folder / "traces.jsonl"
    start = time.perf_counter()
    with path.open("wb") as out:
        for i, session in enumerate(work.sessions):
            for seq, turn in enumerate(session):
                out.write(
                    orjson.dumps({"session_id": f"s{i}", "seq": seq, "turn": turn.model_dump()}) + b"\n"
                )
                out.flush()
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with path.open("rb") as lines:
        loaded = [TrainingTurn.model_validate(orjson.loads(line)["turn"]) for line in lines]
    read_s = time.perf_counter() - start
    assert len(loaded) == work.turns
    arrays = sum(
        len(orjson.dumps(t.prompt_token_ids))
        + len(orjson.dumps(t.completion_token_ids))
        + len(orjson.dumps(t.per_token_logps))
        + len(orjson.dumps(t.loss_mask))
        for t in loaded
    )
    return Result("JSONL", write_s, read_s, path.stat().st_size, arrays)


def _session(i: int) -> SessionRecord:
    return SessionRecord(
        session_id=f"s{i}",
        api_key_hash=f"{i:064x}",
        model="policy",
        llm_url="http://engine/v1",
        created_at=time.time(),
    )


async def _ingest(store: TraceStore, work: Workload) -> float:
    for i in range(len(work.sessions)):
        store.create_session(_session(i))
    writer = turn_writer(store)

    async def agent(i: int) -> None:
        for seq, turn in enumerate(work.sessions[i]):
            await writer.write(f"s{i}", seq, turn)

    start = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(len(work.sessions))))
    elapsed = time.perf_counter() - start
    await writer.aclose()
    return elapsed


def _array_bytes(store: TraceStore) -> int:
    columns = (TurnRow.prompt_ids, TurnRow.completion_ids, TurnRow.logps, TurnRow.loss_mask)
    with store._engine.connect() as conn:
        return int(conn.execute(select(func.sum(sum(func.length(c) for c in columns)))).scalar_one())


def _read_all(store: TraceStore, work: Workload) -> float:
    start = time.perf_counter()
    loaded = sum(len(store.get_turns(f"s{i}")) for i in range(len(work.sessions)))
    elapsed = time.perf_counter() - start
    assert loaded == work.turns
    return elapsed


def bench_sqlite(work: Workload, folder: Path) -> Result:
    path = folder / "traces.db"
    store = TraceStore(f"sqlite:///{path}")
    write_s = asyncio.run(_ingest(store, work))
    read_s = _read_all(store, work)
    arrays = _array_bytes(store)
    with store._engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return Result("SQLite (WAL)", write_s, read_s, path.stat().st_size, arrays)


def bench_postgres(work: Workload, base_url: str) -> Result:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        store = TraceStore(url.render_as_string(hide_password=False))
        write_s = asyncio.run(_ingest(store, work))
        read_s = _read_all(store, work)
        with store._engine.connect() as conn:
            nbytes = conn.execute(text("SELECT pg_total_relation_size('turns')")).scalar_one()
        arrays = _array_bytes(store)
        store.close()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    return Result("PostgreSQL", write_s, read_s, nbytes, arrays)


ROLLOUT_TURNS = 50


def vllm_reply(prompt: list[int], completion: list[int], logps: list[float], text: str) -> dict:
    """A vLLM chat completion as the proxy relays it to an agent that asked for ids and logprobs."""
    content = [
        {"token": f"token_id:{t}", "logprob": lp, "bytes": list(f"token_id:{t}".encode()), "top_logprobs": []}
        for t, lp in zip(completion, logps, strict=True)
    ]
    choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
              "logprobs": {"content": content}, "finish_reason": "stop", "token_ids": completion}  # fmt: skip
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "policy", "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
            "prompt_token_ids": prompt}  # fmt: skip


def growing_rollout(n_turns: int, seed: int = 1) -> list[TrainingTurn]:
    """One agent's rollout: every turn resends the history, which grows by the reply and a tool output."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, VOCAB, 1500).tolist()
    messages = [{"role": "system", "content": _text(rng, 1000)}, {"role": "user", "content": _text(rng, 500)}]
    turns = []
    for k in range(n_turns):
        completion = rng.integers(0, VOCAB, 120).tolist()
        logps = (-rng.exponential(0.5, len(completion))).tolist()
        answer = _text(rng, len(completion))
        turns.append(
            TrainingTurn(
                node_id=f"t{k}",
                prompt_token_ids=list(context),
                completion_token_ids=completion,
                per_token_logps=logps,
                loss_mask=[0] * len(context) + [1] * len(completion),
                request={
                    "model": "policy",
                    "messages": list(messages),
                    "logprobs": True,
                    "return_token_ids": True,
                },
                response=vllm_reply(list(context), completion, logps, answer),
                metadata=TurnMetadata(
                    policy_version=3, finish_reason="stop", latency_s=0.8, created_at=time.time()
                ),
            )  # fmt: skip
        )
        tool_output = rng.integers(0, VOCAB, 300).tolist()
        context += completion + tool_output
        messages += [{"role": "assistant", "content": answer}, {"role": "tool", "content": _text(rng, 300)}]
    return turns


def _full_bytes(turn: TrainingTurn) -> int:
    """The turn stored in full: its request and response JSON and its prompt ids without a shared prefix."""
    return (
        len(orjson.dumps(turn.request)) + len(orjson.dumps(turn.response)) + len(orjson.dumps(turn.metadata.model_dump()))
        + 4 * len(turn.prompt_token_ids) + 12 * len(turn.completion_token_ids)
        + (len(turn.loss_mask) + 7) // 8
    )  # fmt: skip


def bench_rollout(folder: Path, n_turns: int = ROLLOUT_TURNS) -> tuple[Table, str]:
    turns = growing_rollout(n_turns)
    store = TraceStore(f"sqlite:///{folder / 'rollout.db'}")
    store.create_session(_session(0))
    for seq, turn in enumerate(turns):
        store.add_turn("s0", seq, turn)
    row = sum(
        func.length(c)
        for c in (TurnRow.prompt_ids, TurnRow.completion_ids, TurnRow.logps, TurnRow.loss_mask,
                  TurnRow.request, TurnRow.response, TurnRow.meta)
    )  # fmt: skip
    with store._engine.connect() as conn:
        sizes = [int(n) for n in conn.execute(select(row).order_by(TurnRow.seq)).scalars()]
    back = store.get_turns("s0")
    store.close()
    assert [t.model_dump() for t in back] == [t.model_dump() for t in turns], (
        "the rollout did not read back as written"
    )
    full = [_full_bytes(t) for t in turns]
    tenth = n_turns // 10
    table = Table(
        title=f"One {n_turns}-turn rollout with a growing history: bytes stored per turn, per tenth"
    )
    for column in ("tenth", "history KB", "prompt ids", "stored B/turn", "in full B/turn"):
        table.add_column(column, justify="right")
    for i in range(10):
        part = slice(i * tenth, (i + 1) * tenth)
        last = turns[part][-1]
        table.add_row(
            str(i + 1), f"{len(orjson.dumps(last.request['messages'])) / 1024:.0f}", str(len(last.prompt_token_ids)),
            f"{sum(sizes[part]) / tenth:,.0f}", f"{sum(full[part]) / tenth:,.0f}",
        )  # fmt: skip
    first, last = sum(sizes[:tenth]), sum(sizes[-tenth:])
    verdict = (
        f"{n_turns}-turn rollout, last tenth / first tenth of the bytes per turn: stored {last / first:.2f} "
        f"(target <= 1.20: {'yes' if last / first <= 1.2 else 'NO'}), in full "
        f"{sum(full[-tenth:]) / sum(full[:tenth]):.2f}; every turn read back identical"
    )
    return table, verdict


def render(work: Workload, results: list[Result]) -> Table:
    base = results[0]
    table = Table(
        title=f"Trace store ingest: {len(work.sessions)} sessions, {work.turns} turns, "
        f"{work.tokens / 1e6:.2f} M tokens (prompt + completion, summed over turns)"
    )
    for column in (
        "store",
        "write turns/s",
        "vs JSONL",
        "read turns/s",
        "vs JSONL",
        "MB",
        "bytes/token",
        "size vs JSONL",
        "arrays B/token",
    ):
        table.add_column(column, justify="left" if column == "store" else "right")
    for r in results:
        table.add_row(
            r.name,
            f"{work.turns / r.write_s:,.0f}",
            f"{base.write_s / r.write_s:.2f}x",
            f"{work.turns / r.read_s:,.0f}",
            f"{base.read_s / r.read_s:.2f}x",
            f"{r.nbytes / 1e6:.1f}",
            f"{r.nbytes / work.tokens:.2f}",
            f"{r.nbytes / base.nbytes:.2f}x",
            f"{r.array_bytes / work.tokens:.2f}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small workload (seconds)")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 32, quick 8)")
    parser.add_argument("--turns", type=int, help="turns per session (default 30, quick 10)")
    args = parser.parse_args()
    sessions = args.sessions or (8 if args.quick else 32)
    turns = args.turns or (10 if args.quick else 30)

    console = Console(width=max(Console().width, 120))
    with console.status("generating sessions"):
        work = make_workload(sessions, turns)
    results = []
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp:
        folder = Path(tmp)
        with console.status("JSONL"):
            results.append(bench_jsonl(work, folder))
        with console.status("SQLite"):
            results.append(bench_sqlite(work, folder))
        with console.status("a growing rollout"):
            rollout, rollout_verdict = bench_rollout(folder)
    pg_url = os.environ.get("HARBOR_TEST_POSTGRES_URL")
    if pg_url:
        with console.status("PostgreSQL"):
            results.append(bench_postgres(work, pg_url))
    console.print(render(work, results))
    console.print(rollout)
    console.print(rollout_verdict)
    if not pg_url:
        console.print("PostgreSQL skipped: set HARBOR_TEST_POSTGRES_URL to include it.")
    console.print(
        "bytes/token counts everything stored (request/response JSON included) over every turn's "
        "prompt + completion tokens; 'arrays B/token' counts only token ids, logprobs and loss masks. "
        "'vs JSONL' above 1x means faster; size below 1x means smaller."
    )


if __name__ == "__main__":
    main()
