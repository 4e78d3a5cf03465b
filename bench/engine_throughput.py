"""Embedded engine throughput: completion tokens/s at 1 and 16 concurrent clients, side by side.

Starts `harbor engine --model tiny` in a subprocess (so client and server do not share a GIL), drives
it with the real `openai` async client, and prints a rich table with the aggregate tokens/s and the
ratio of 16 concurrent clients to one. Batching should give at least 3x.

    python bench/engine_throughput.py [--quick] [--model tiny|PATH] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import httpx
import openai
from rich.console import Console
from rich.table import Table

TARGET_RATIO = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(model: str, port: int, threads: int) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from harbor_rl.cli import app; app()", "engine", "--model", model,
           "--port", str(port), "--num-threads", str(threads), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 300  # first run builds the tiny model
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("engine did not start in time")


async def run(client: openai.AsyncOpenAI, model: str, concurrency: int, requests: int, max_tokens: int):
    """`requests` completions spread over `concurrency` workers; returns (tokens, seconds)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty():
            i = queue.get_nowait()
            prompt = [(17 * i + k) % 1000 + 10 for k in range(48)]
            r = await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=1.0,
                extra_body={"ignore_eos": True},
            )
            tokens += r.usage.completion_tokens

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens, time.perf_counter() - start


async def bench(url: str, model: str, quick: bool) -> list[tuple[int, int, int, float]]:
    max_tokens = 32 if quick else 64
    plan = [(1, 3 if quick else 6), (16, 16 if quick else 48)]
    rows = []
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="bench", max_retries=0, timeout=600
    ) as client:
        await run(client, model, 2, 2, 4)  # warm-up
        for concurrency, requests in plan:
            tokens, seconds = await run(client, model, concurrency, requests, max_tokens)
            rows.append((concurrency, requests, tokens, seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    args = parser.parse_args()
    port = free_port()
    proc = start_engine(args.model, port, args.threads)
    try:
        rows = asyncio.run(bench(f"http://127.0.0.1:{port}", args.model, args.quick))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    base = rows[0][2] / rows[0][3]
    table = Table(title=f"embedded engine throughput ({args.model}, {args.threads} torch threads)")
    for col in ("concurrency", "requests", "completion tokens", "wall s", "tokens/s", "vs concurrency 1"):
        table.add_column(col, justify="right")
    for concurrency, requests, tokens, seconds in rows:
        rate = tokens / seconds
        table.add_row(
            str(concurrency),
            str(requests),
            str(tokens),
            f"{seconds:.2f}",
            f"{rate:.1f}",
            f"{rate / base:.2f}x",
        )
    console = Console()
    console.print(table)
    ratio = (rows[1][2] / rows[1][3]) / base
    verdict = "[green]meets[/green]" if ratio >= TARGET_RATIO else "[red]misses[/red]"
    console.print(f"batching gain at 16: {ratio:.2f}x, {verdict} the {TARGET_RATIO:.0f}x target")


if __name__ == "__main__":
    main()
