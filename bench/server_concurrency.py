"""Concurrent rollouts on one `harbor serve`: throughput, and /health latency while they run.

One real server (`harbor serve` in its own process: uvicorn on 127.0.0.1, SQLite store, `local`
sandboxes with bubblewrap, built-in tasks). For each load level N, N rollouts are started at once
with the given harness from one asyncio client, while poller threads hit /health every 10 ms on two
servers side by side. Harnesses: `nop` (sandbox start, verifier, stop; no model), `oracle`, and `hold`
(this benchmark's own: the agent is `sleep --hold-s` inside its sandbox, so all N rollouts are live at
once, each with its sandbox process, as agents waiting on a model are). The two servers:

- `harbor serve` itself;
- a reference: a bare FastAPI + uvicorn app with the same /health, in its own process, doing nothing
  else. Its latency is what the machine's scheduler gives any process under the rollouts' load (on a
  2-core machine, 32 verifiers running pytest saturate it); the ratio serve/reference is the server's
  own share of the latency.

The idle row is the same pollers with nothing running. Every rollout is checked: completed, with its
own episode id and task (none lost, none mixed up). While a level runs, the server's process tree is
sampled: the most rollouts live at once (/health), its peak memory (RSS of the server and every
sandbox process under it) above the idle server's, per live rollout, and its peak open file descriptors.

    python bench/server_concurrency.py [--quick] [--levels 8 32 64] [--harness nop|oracle|hold]
    python bench/server_concurrency.py --harness hold --hold-s 30 --levels 100 400
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from harbor_server.client import AsyncHarborSessionFactory, HarborClient
from harbor_server.embedded import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._sampling import PeriodicSampler  # noqa: E402

POLL_INTERVAL_S = 0.01
IDLE_S = 5.0
TARGET_P99_MS = 100.0

REFERENCE_APP = """
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()

@app.get("/health")
async def health() -> dict:
    return {"status": "ok", "live_rollouts": 0}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


HOLD_HARNESS = "hold"
HOLD_ENV = "HARBOR_BENCH_HOLD_S"


class HoldHarness:
    """An agent that holds its sandbox for $HARBOR_BENCH_HOLD_S seconds (`sleep` in the sandbox) and does
    nothing else: a live rollout waiting on its model, without a model."""

    name = HOLD_HARNESS

    def image_layer(self) -> None:
        return None

    async def run(self, sandbox, run):
        from harnesses.base import AgentOutcome

        result = await sandbox.exec(["sleep", os.environ.get(HOLD_ENV, "10")], timeout_s=run.timeout_s)
        return AgentOutcome(exit_code=result.exit_code)


def serve_with_hold_harness() -> None:
    """`harbor serve` (argv) with the hold harness registered: the server process's entry point."""
    from harbor_rl.cli import app
    from harnesses import register_harness

    register_harness(HOLD_HARNESS, HoldHarness)
    app()


@dataclass
class TreeSample:
    """The most a process tree used while sampled."""

    rss_bytes: int = 0
    fds: int = 0
    live: int = 0


class TreeSampler(PeriodicSampler):
    """Every 0.5 s: RSS of `pid` and its descendants, `pid`'s open file descriptors, /health's live rollouts."""

    def __init__(self, pid: int, url: str) -> None:
        super().__init__(0.5)
        self.root = psutil.Process(pid)
        self.url = url + "/health"
        self.peak = TreeSample()

    def sample(self) -> TreeSample:
        rss = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:  # exited between the listing and the read
                continue
        try:
            live = int(httpx.get(self.url, timeout=5).json().get("live_rollouts", 0))
        except (httpx.HTTPError, ValueError):
            live = 0
        return TreeSample(rss, self.root.num_fds(), live)

    def tick(self) -> None:
        now = self.sample()
        self.peak = TreeSample(
            max(self.peak.rss_bytes, now.rss_bytes),
            max(self.peak.fds, now.fds),
            max(self.peak.live, now.live),
        )


@dataclass
class Row:
    name: str
    rollouts: int
    wall_s: float
    serve_s: list[float]
    reference_s: list[float]
    load_avg: float = 0.0
    lost: int = 0
    mixed: int = 0
    failed: int = 0
    peak_live: int = 0
    rss_above_idle_bytes: int = 0
    peak_fds: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def mib_per_live(self) -> float:
        return self.rss_above_idle_bytes / max(1, self.peak_live) / 2**20


def pct(latencies: list[float], q: float) -> float:
    return float(np.percentile(latencies, q)) * 1000 if latencies else float("nan")


class HealthPoller:
    """/health every POLL_INTERVAL_S on its own thread and connection, recording each latency."""

    def __init__(self, url: str) -> None:
        self.url = url + "/health"
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - t0)
                self.errors += not ok
                self._stop.wait(POLL_INTERVAL_S)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Process:
    """A server in its own process (so the benchmark's threads never share its GIL)."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid

    def __enter__(self) -> Process:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"server at {self.url} did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def harbor_serve(tmp: str, max_envs: int, hold_s: float) -> Process:
    port = free_port()
    entry = "from bench.server_concurrency import serve_with_hold_harness; serve_with_hold_harness()"
    cmd = [
        sys.executable, "-c", entry, "serve", "--dataset", "builtin",
        "--port", str(port), "--capture-port", str(free_port()), "--capture-host", "127.0.0.1",
        "--sandbox", "local", "--store", f"sqlite:///{tmp}/traces.db", "--skip-engine-check",
        "--max-concurrent", str(max_envs),
    ]  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = os.environ | {"HARBOR_RUNS_DIR": os.path.join(tmp, "runs"), HOLD_ENV: str(hold_s)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return Process(cmd, port, env)


def reference_server() -> Process:
    port = free_port()
    return Process([sys.executable, "-c", REFERENCE_APP, str(port)], port)


async def _rollouts(url: str, n: int, harness: str, n_tasks: int) -> list:
    async with AsyncHarborSessionFactory(
        url, split="builtin", harness=harness, sandbox="local", llm_url="http://127.0.0.1:9/v1", model="none"
    ) as factory:
        sessions = await asyncio.gather(
            *(factory.create(i % n_tasks, seed=i, episode_id=f"e{i}") for i in range(n))
        )
        return await asyncio.gather(*(s.wait_for_completion(timeout_s=1800) for s in sessions))


def run_level(server: Process, reference_url: str, n: int, harness: str, tasks: list[str]) -> Row:
    idle = TreeSampler(server.pid, server.url).sample()
    with (
        HealthPoller(server.url) as serve,
        HealthPoller(reference_url) as reference,
        TreeSampler(server.pid, server.url) as tree,
    ):
        t0 = time.perf_counter()
        results = asyncio.run(_rollouts(server.url, n, harness, len(tasks)))
        wall = time.perf_counter() - t0
        load = os.getloadavg()[0]
    row = Row(f"{n} concurrent {harness}", n, wall, serve.latencies, reference.latencies, load_avg=load)
    row.peak_live, row.peak_fds = tree.peak.live, tree.peak.fds
    row.rss_above_idle_bytes = max(0, tree.peak.rss_bytes - idle.rss_bytes)
    row.lost = n - len({r.rollout_id for r in results})
    for i, result in enumerate(results):
        row.mixed += result.episode_id != f"e{i}" or result.task_id != tasks[i % len(tasks)]
        row.failed += result.status != "completed"
    row.failed += serve.errors
    return row


def idle_row(serve_url: str, reference_url: str) -> Row:
    with HealthPoller(serve_url) as serve, HealthPoller(reference_url) as reference:
        time.sleep(IDLE_S)
        load = os.getloadavg()[0]
    return Row("idle", 0, IDLE_S, serve.latencies, reference.latencies, load_avg=load, failed=serve.errors)


def report(rows: list[Row], harness: str, console: Console) -> None:
    table = Table(title=f"harbor serve: concurrent rollouts ({harness}, local sandbox) and /health latency")
    columns = ("load", "wall s", "rollouts/min", "load avg", "serve p50 ms", "serve p99 ms", "serve max ms",
               "ref p99 ms", "p99 serve/ref", "peak live", "MiB/live", "peak fds", "lost", "mixed",
               "failed")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "load" else "right")
    for row in rows:
        rate = f"{60 * row.rollouts / row.wall_s:.0f}" if row.rollouts else "-"
        serve_p99, ref_p99 = pct(row.serve_s, 99), pct(row.reference_s, 99)
        table.add_row(
            row.name, f"{row.wall_s:.1f}", rate, f"{row.load_avg:.1f}", f"{pct(row.serve_s, 50):.1f}",
            f"{serve_p99:.1f}", f"{max(row.serve_s) * 1000:.1f}", f"{ref_p99:.1f}", f"{serve_p99 / ref_p99:.2f}x",
            str(row.peak_live) if row.rollouts else "-", f"{row.mib_per_live:.1f}" if row.rollouts else "-",
            str(row.peak_fds) if row.rollouts else "-", str(row.lost), str(row.mixed), str(row.failed),
        )  # fmt: skip
    console.print(table)
    worst = max(rows, key=lambda r: pct(r.serve_s, 99))
    p99 = pct(worst.serve_s, 99)
    verdict = "[green]under[/]" if p99 < TARGET_P99_MS else "[red]over[/]"
    console.print(
        f"worst harbor serve /health p99: {p99:.1f} ms ({verdict} the {TARGET_P99_MS:.0f} ms target) at "
        f"{worst.name}; the idle reference app measured {pct(worst.reference_s, 99):.1f} ms at the same time "
        f"on this {os.cpu_count()}-CPU machine"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one load level (32), for a smoke run")
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--harness", default="nop", choices=["nop", "oracle", HOLD_HARNESS])
    parser.add_argument(
        "--hold-s", type=float, default=20.0, help="how long each hold rollout keeps its sandbox"
    )
    args = parser.parse_args()
    levels = [32] if args.quick else args.levels
    console = Console()

    with (
        tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp,
        harbor_serve(tmp, max(levels), args.hold_s) as serve,
        reference_server() as reference,
    ):
        client = HarborClient(serve.url)
        tasks = [task.task_id for task in client.iter_tasks("builtin")]
        client.close()
        rows = [idle_row(serve.url, reference.url)]
        for n in levels:
            console.print(f"running {n} concurrent {args.harness} rollouts ...")
            rows.append(run_level(serve, reference.url, n, args.harness, tasks))
    report(rows, args.harness, console)


if __name__ == "__main__":
    main()
