"""Capture-proxy overhead against calling the same engine directly, measured side by side in one run.

    python bench/proxy_overhead.py [--quick]

The engine is `engine.imitation`'s vLLM imitation (512 prompt ids, 64 completion tokens, with
logprobs and token ids), in its own process pinned to core 1; the proxy (uvicorn + the real SQLite trace
store, every turn committed before its reply completes) in its own process pinned to core 0; the load
generator (httpx, async) shares core 1 with the engine, so it costs the direct and the proxied runs
alike. For 1, 16 and 64 concurrent clients, streaming and not, it reports req/s, p50/p99 latency and
the proxy process's CPU milliseconds per request (all its threads' run time, bench/_cpu.py, turn
writes included), and how much of it went to writing turns (thread CPU time around each store
write). Then one 2,000-turn session checks that a turn's cost does not grow with the session's
length (last tenth within 20% of the first).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._clients import agent_clients  # noqa: E402
from bench._cpu import process_cpu_ms  # noqa: E402

MODEL = "imitation-model"
ADMIN_KEY = "bench-admin-key-0123456789"
PROMPT_TOKENS, COMPLETION_TOKENS = 512, 64
TARGET_CPU_MS, TARGET_ADDED_P50_MS = 1.5, 1.5
MESSAGES = [
    {
        "role": "system",
        "content": "You are a coding agent. Use the bash tool to inspect and fix the repository.",
    },
    {
        "role": "user",
        "content": "The test suite fails in tests/test_parser.py; find the bug and fix it. " * 8,
    },
]

console = Console(width=170)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAILURES: list[str] = []
"""Calls that failed (connection errors, non-200), reported after the tables."""


def store_cpu_ms(proxy_url: str) -> float:
    """CPU milliseconds the proxy has spent writing turns so far (`serve_proxy`'s TimedStore)."""
    return float(httpx.get(f"{proxy_url}/bench/store-cpu-ms", timeout=10).text)


def pinned(core: int | None):
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def start(args: list[str], core: int | None, health: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, *args], preexec_fn=pinned(core), cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(health, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited with {proc.returncode}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args} did not become healthy at {health}")


def serve_proxy(port: int, upstream: str, store_url: str) -> None:
    """The proxy process: the same app `harbor proxy` serves, its store timing its turn writes (CPU
    time of the thread that runs them: the event loop's on SQLite) behind one extra route."""
    import uvicorn
    from starlette.responses import PlainTextResponse

    from capture_proxy.app import create_app
    from capture_proxy.config import ProxyConfig
    from capture_proxy.store import TraceStore

    class TimedStore(TraceStore):
        cpu_ns = 0

        def add_turns(self, items):
            start = time.thread_time_ns()
            try:
                super().add_turns(items)
            finally:
                TimedStore.cpu_ns += time.thread_time_ns() - start

    config = ProxyConfig(upstream_url=upstream, admin_key=ADMIN_KEY)
    app = create_app(config, TimedStore(store_url), close_store=True)
    app.add_route("/bench/store-cpu-ms", lambda _: PlainTextResponse(str(TimedStore.cpu_ns / 1e6)))
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=75
    )


def upstream_body(stream: bool) -> bytes:
    """What the proxy sends the engine for a train session: also the body of the direct calls."""
    from capture_proxy.upstream import rewrite_request

    body = {"model": MODEL, "messages": MESSAGES, "stream": stream}
    return orjson.dumps(rewrite_request(body, endpoint="chat", model=MODEL, purpose="train", sampling={})[0])


async def load(
    url: str, key: str, body: bytes, stream: bool, concurrency: int, n: int
) -> tuple[float, list[float]]:
    """`n` calls from `concurrency` clients, each its own (bench/_clients.py); returns wall seconds and
    each call's latency."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    latencies: list[float] = []
    counter = itertools.count()

    async def worker(client: httpx.AsyncClient) -> None:
        while next(counter) < n:
            t0 = time.perf_counter()
            try:
                if stream:
                    async with client.stream("POST", url, content=body, headers=headers) as r:
                        async for _ in r.aiter_raw():
                            pass
                else:
                    r = await client.post(url, content=body, headers=headers)
            except httpx.TransportError as exc:  # counted and shown, not fatal: an overloaded box drops some
                FAILURES.append(f"{url}: {exc!r}")
                continue
            if r.status_code != 200:
                FAILURES.append(f"{url} answered {r.status_code}: {r.read()[:300]!r}")
                continue
            latencies.append(time.perf_counter() - t0)

    async with agent_clients(concurrency, 120) as clients:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        return time.perf_counter() - t0, latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def new_session(proxy_url: str) -> str:
    r = httpx.post(
        f"{proxy_url}/sessions", json={"model": MODEL}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    r.raise_for_status()
    return r.json()["api_key"]


async def overhead(engine_url: str, proxy_url: str, proxy_pid: int, quick: bool) -> list[dict]:
    rows = []
    counts = {1: 150, 16: 400, 64: 640} if quick else {1: 600, 16: 2000, 64: 3200}
    for stream in (False, True):
        body = upstream_body(stream)
        for concurrency, n in counts.items():
            warm = max(20, concurrency * 2)
            row = {"stream": stream, "concurrency": concurrency, "n": n}
            await load(f"{engine_url}/v1/chat/completions", "unused", body, stream, concurrency, warm)
            wall, lat = await load(
                f"{engine_url}/v1/chat/completions", "unused", body, stream, concurrency, n
            )
            row["direct"] = (n / wall, pct(lat, 0.5), pct(lat, 0.99))
            key = new_session(proxy_url)
            await load(f"{proxy_url}/v1/chat/completions", key, body, stream, concurrency, warm)
            store_before = store_cpu_ms(proxy_url)  # read outside the CPU window
            before = process_cpu_ms(proxy_pid)
            wall, lat = await load(f"{proxy_url}/v1/chat/completions", key, body, stream, concurrency, n)
            cpu_ms = (process_cpu_ms(proxy_pid) - before) / n
            row["store_ms"] = (store_cpu_ms(proxy_url) - store_before) / n
            row["proxy"] = (n / wall, pct(lat, 0.5), pct(lat, 0.99))
            row["cpu_ms"] = cpu_ms
            rows.append(row)
            console.log(
                f"stream={stream} c={concurrency}: direct {row['direct'][0]:.0f} req/s, proxy {row['proxy'][0]:.0f} "
                f"req/s, +{row['proxy'][1] - row['direct'][1]:.2f} ms p50, {cpu_ms:.2f} ms CPU/req "
                f"({row['store_ms']:.2f} writing turns)"
            )
    return rows


async def long_session(proxy_url: str, proxy_pid: int, turns: int) -> list[tuple[float, float]]:
    """One session of `turns` sequential calls; per tenth: median call ms and proxy CPU ms per call."""
    key = new_session(proxy_url)
    body = upstream_body(False)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    tenth = turns // 10
    out = []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(10):
            lat = []
            before = process_cpu_ms(proxy_pid)
            for _ in range(tenth):
                t0 = time.perf_counter()
                r = await client.post(f"{proxy_url}/v1/chat/completions", content=body, headers=headers)
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)
            out.append((statistics.median(lat) * 1000, (process_cpu_ms(proxy_pid) - before) / tenth))
    return out


def report(rows: list[dict], tenths: list[tuple[float, float]], turns: int) -> bool:
    table = Table(
        title="Capture proxy vs direct engine (vLLM imitation: 512 prompt ids, 64 completion tokens)"
    )
    for col in ("stream", "clients", "direct req/s", "proxy req/s", "ratio", "direct p50 ms", "proxy p50 ms",
                "added p50 ms", "direct p99 ms", "proxy p99 ms", "proxy CPU ms/req", "of which store"):  # fmt: skip
        table.add_column(col, justify="right")
    ok = True
    for r in rows:
        (dr, dp50, dp99), (pr, pp50, pp99) = r["direct"], r["proxy"]
        added = pp50 - dp50
        cpu_ok = r["cpu_ms"] <= TARGET_CPU_MS
        p50_ok = r["concurrency"] != 1 or added <= TARGET_ADDED_P50_MS
        ok &= cpu_ok and p50_ok
        table.add_row(
            "yes" if r["stream"] else "no", str(r["concurrency"]), f"{dr:.0f}", f"{pr:.0f}", f"{pr / dr:.2f}",
            f"{dp50:.2f}", f"{pp50:.2f}", f"[{'green' if p50_ok else 'red'}]{added:+.2f}", f"{dp99:.2f}", f"{pp99:.2f}",
            f"[{'green' if cpu_ok else 'red'}]{r['cpu_ms']:.2f}", f"{r['store_ms']:.2f}",
        )  # fmt: skip
    console.print(table)
    first, last = tenths[0], tenths[-1]
    growth = last[0] / first[0]
    long = Table(title=f"One session of {turns} turns (sequential, non-streamed): per tenth")
    long.add_column("tenth", justify="right")
    long.add_column("median ms/turn", justify="right")
    long.add_column("proxy CPU ms/turn", justify="right")
    for i, (ms, cpu) in enumerate(tenths, 1):
        long.add_row(str(i), f"{ms:.2f}", f"{cpu:.2f}")
    console.print(long)
    growth_ok = growth <= 1.2
    ok &= growth_ok
    console.print(
        f"last tenth / first tenth: [{'green' if growth_ok else 'red'}]{growth:.2f}[/] (target <= 1.20); "
        f"targets: <= {TARGET_CPU_MS} ms proxy CPU per request, <= {TARGET_ADDED_P50_MS} ms added p50 at 1 client"
    )
    if FAILURES:
        ok = False
        console.print(f"[red]{len(FAILURES)} calls failed[/], first: {FAILURES[0]}")
    console.print("[bold green]all targets met" if ok else "[bold red]some targets missed")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and a 500-turn session")
    parser.add_argument(
        "--serve-proxy", nargs=3, metavar=("PORT", "UPSTREAM", "STORE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_proxy:
        port, upstream, store = args.serve_proxy
        serve_proxy(int(port), upstream, store)
        return

    cores = sorted(os.sched_getaffinity(0))
    proxy_core, engine_core = (cores[0], cores[1]) if len(cores) >= 2 else (None, None)
    if engine_core is not None:
        os.sched_setaffinity(0, {engine_core})  # the load generator shares the engine's core
    else:
        console.print("[yellow]one core only: nothing pinned")
    turns = 500 if args.quick else 2000
    with tempfile.TemporaryDirectory() as tmp:
        engine_port, proxy_port = free_port(), free_port()
        engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
        engine = start(
            ["-m", "engine.imitation", "--port", str(engine_port), "--prompt-tokens", str(PROMPT_TOKENS),
             "--completion-tokens", str(COMPLETION_TOKENS)],
            engine_core, f"{engine_url}/health",
        )  # fmt: skip
        proxy = None
        try:
            proxy = start(
                [__file__, "--serve-proxy", str(proxy_port), engine_url, f"sqlite:///{tmp}/traces.db"],
                proxy_core, f"{proxy_url}/health",
            )  # fmt: skip
            rows = asyncio.run(overhead(engine_url, proxy_url, proxy.pid, args.quick))
            tenths = asyncio.run(long_session(proxy_url, proxy.pid, turns))
        finally:
            for proc in (proxy, engine):
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=20)
    ok = report(rows, tenths, turns)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
