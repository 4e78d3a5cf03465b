"""Trace inspector: opening one rollout and listing pages in a store of 10,000 rollouts.

Fills a SQLite trace store with N synthetic agent rollouts (contexts growing turn by turn, tool calls in
the messages, rewards, runs and policy versions), then measures, side by side in one run:

- opening a rollout as the app does (load the session and turns read-only, validate, build the graph,
  render the HTML), and each of those steps alone; target: under 1 s;
- opening it through the running app over HTTP (Gradio's API route, what a click costs the server);
- one page of the list (newest first, sorted by reward, filtered by run + policy version, the last page)
  against loading every session record (what a list without SQL paging would do).

    python bench/inspector_open.py [--quick] [--rollouts N] [--turns T] [--samples S]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from rich.console import Console
from rich.table import Table

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import SessionRecord, TraceStore
from engine.in_process import serve_in_thread
from inspector.app import Inspector, create_inspector
from inspector.db import open_readonly
from inspector.queries import RolloutQuery, list_rollouts, load_rollout
from inspector.render import build_view, render_rollout

TARGET_S = 1.0
TOOL_OUTPUT = "collected 12 items\n\ntests/test_parser.py ....F.......\n" * 4


def _rollout_turns(rng: random.Random, turns: int, context: int, completion: int) -> list[TrainingTurn]:
    prompt = [rng.randrange(50, 150_000) for _ in range(context)]
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix the failing parser test."},
    ]
    out = []
    for seq in range(turns):
        comp = [rng.randrange(50, 150_000) for _ in range(completion)]
        call = {
            "id": f"call_{seq}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "pytest -q"}'},
        }
        reply = {"role": "assistant", "content": None, "tool_calls": [call]}
        out.append(
            TrainingTurn(
                node_id=f"t{seq}",
                prompt_token_ids=prompt,
                completion_token_ids=comp,
                per_token_logps=[-rng.random() * 3 for _ in comp],
                loss_mask=[0] * len(prompt) + [1] * len(comp),
                request={
                    "model": "policy",
                    "messages": list(messages),
                    "tools": [{"type": "function", "function": {"name": "bash"}}],
                },
                response={"choices": [{"index": 0, "message": reply, "finish_reason": "tool_calls"}]},
                metadata=TurnMetadata(policy_version=None, finish_reason="tool_calls", latency_s=0.4),
            )
        )
        messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": TOOL_OUTPUT}]
        prompt = prompt + comp + [rng.randrange(50, 150_000) for _ in range(context // 4)]
    return out


def fill_store(url: str, rollouts: int, turns: int, context: int, completion: int, console: Console) -> None:
    rng = random.Random(7)
    store = TraceStore(url)
    started = time.perf_counter()
    # A few distinct rollouts, reused under new ids: building TrainingTurns is not what is measured.
    templates = [_rollout_turns(rng, turns, context, completion) for _ in range(16)]
    batch: list[tuple[str, int, TrainingTurn]] = []
    for i in range(rollouts):
        sid = f"rollout-{i:06d}"
        version = i * 50 // rollouts
        store.create_session(
            SessionRecord(
                session_id=sid,
                api_key_hash=f"{i:064x}",
                status="completed" if i % 10 else "failed",
                model="policy",
                llm_url="http://127.0.0.1:8000/v1",
                multi_step_task=True,
                task_id=f"builtin/task-{i % 97}",
                harness=("mini-swe-agent", "opencode")[i % 2],
                sandbox="docker",
                reward=None if i % 10 == 0 else rng.random(),
                rewards={"tests_passed": 1.0},
                metadata={"rollout": {"split": "builtin", "metadata": {"run": f"run-{i % 3}"}}},
                created_at=1_790_000_000 + i * 6.0,
                finished_at=1_790_000_000 + i * 6.0 + 5.0,
            )
        )
        for seq, turn in enumerate(templates[i % len(templates)]):
            md = turn.metadata.model_copy(update={"policy_version": version})
            batch.append((sid, seq, turn.model_copy(update={"metadata": md})))
        if len(batch) >= 2_000:
            store.add_turns(batch)
            batch = []
        if (i + 1) % 2_000 == 0:
            console.print(f"  {i + 1} rollouts stored ({time.perf_counter() - started:.0f} s)")
    store.add_turns(batch)
    store.close()


def timed(fn: Callable[[], object], samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 rollouts, fewer samples")
    parser.add_argument("--rollouts", type=int, default=None)
    parser.add_argument("--turns", type=int, default=12, help="turns per rollout")
    parser.add_argument("--context", type=int, default=1_500, help="tokens of the first prompt")
    parser.add_argument("--completion", type=int, default=150, help="tokens per completion")
    parser.add_argument("--samples", type=int, default=None)
    args = parser.parse_args()
    rollouts = args.rollouts or (1_000 if args.quick else 10_000)
    samples = args.samples or (5 if args.quick else 20)
    console = Console(width=150)

    with tempfile.TemporaryDirectory(prefix="harbor-inspector-bench-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'traces.db'}"
        console.print(f"filling {url} with {rollouts} rollouts x {args.turns} turns ...")
        fill_store(url, rollouts, args.turns, args.context, args.completion, console)
        size_mb = (Path(tmp) / "traces.db").stat().st_size / 2**20
        engine = open_readonly(url)
        rng = random.Random(1)
        pick = lambda: f"rollout-{rng.randrange(1, rollouts):06d}"  # noqa: E731

        loaded = load_rollout(engine, pick())
        view = build_view(loaded)
        html = render_rollout(view)
        rows: list[tuple[str, list[float]]] = [
            (
                "open rollout (load + validate + graph + render)",
                timed(lambda: render_rollout(build_view(load_rollout(engine, pick()))), samples),
            ),
            ("  load session + turns (SQL, read-only)", timed(lambda: load_rollout(engine, pick()), samples)),
            ("  validate + graph", timed(lambda: build_view(loaded), samples)),
            ("  render HTML", timed(lambda: render_rollout(view), samples)),
        ]
        demo = create_inspector(url, inspector=Inspector(url))
        import gradio as gr

        app = gr.mount_gradio_app(FastAPI(), demo, path="/inspect")
        with serve_in_thread(app) as base:
            from gradio_client import Client

            client = Client(f"{base}/inspect/", verbose=False)
            client.predict(pick(), api_name="/open_rollout")  # warm up
            rows.append(
                (
                    "open rollout over HTTP (Gradio API)",
                    timed(lambda: client.predict(pick(), api_name="/open_rollout"), samples),
                )
            )
            client.close()
        list_rows: list[tuple[str, list[float]]] = [
            ("list page: newest first", timed(lambda: list_rollouts(engine, RolloutQuery()), samples)),
            (
                "list page: sorted by reward",
                timed(lambda: list_rollouts(engine, RolloutQuery(sort="reward")), samples),
            ),
            (
                "list page: run + policy version filter",
                timed(
                    lambda: list_rollouts(
                        engine, RolloutQuery(run="run-1", policy_version_min=10, policy_version_max=20)
                    ),
                    samples,
                ),
            ),
            (
                "list page: last page",
                timed(lambda: list_rollouts(engine, RolloutQuery(page=max(1, rollouts // 50))), samples),
            ),
        ]
        store = TraceStore(url)
        naive = timed(lambda: store.list_sessions(limit=rollouts), max(2, samples // 4))
        store.close()
        engine.dispose()
        demo.inspector.close()  # type: ignore[attr-defined]

    def p(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]

    table = Table(
        title=f"Trace inspector, {rollouts} rollouts x {args.turns} turns ({size_mb:.0f} MB SQLite)"
    )
    for col in ("operation", "p50 ms", "p95 ms", "max ms", "vs target 1 s", "vs loading all sessions"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    naive_p50 = statistics.median(naive)
    for name, xs in rows + list_rows:
        table.add_row(
            name,
            f"{statistics.median(xs) * 1000:.1f}",
            f"{p(xs, 0.95) * 1000:.1f}",
            f"{max(xs) * 1000:.1f}",
            f"{max(xs) / TARGET_S:.3f}x",
            f"{naive_p50 / statistics.median(xs):.0f}x faster" if (name, xs) in list_rows else "",
        )
    table.add_row(
        "load every session record (no paging)",
        f"{naive_p50 * 1000:.1f}",
        f"{p(naive, 0.95) * 1000:.1f}",
        f"{max(naive) * 1000:.1f}",
        "",
        "1x",
    )
    console.print(table)
    worst = max(max(xs) for _, xs in rows)
    console.print(
        f"rollout page: {len(html) / 1024:.0f} KiB of HTML, {len(loaded.turns)} turns; slowest open {worst * 1000:.0f} ms "
        + ("[green](under 1 s: target met)[/]" if worst < TARGET_S else "[red](over 1 s: target missed)[/]")
    )


if __name__ == "__main__":
    main()
