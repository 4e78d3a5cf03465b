"""Sandbox lifecycle benchmark: start, exec round-trip and stop per backend, and Docker concurrency.

    python bench/sandbox_lifecycle.py            # median of 10, a one-minute concurrency window
    python bench/sandbox_lifecycle.py --quick    # median of 3, a 15-second window

Everything is measured side by side in one run; ratios are against the local backend (absolute
times on a shared machine are noise). The e2b backend runs only when E2B_API_KEY is set.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes import SandboxError, SandboxSpec, get_backend  # noqa: E402

BASE_IMAGE = "harbor-rl/sandbox-base:bookworm"


def spec(**overrides) -> SandboxSpec:
    values = {"name": f"bench-{uuid.uuid4().hex[:8]}", "docker_image": BASE_IMAGE, "memory_mb": 256}
    values.update(overrides)
    return SandboxSpec(**values)


async def lifecycle(backend, rounds: int) -> dict[str, float]:
    """Median seconds for start, an exec round-trip (`true`) and stop, over `rounds` sandboxes."""
    starts, execs, stops = [], [], []
    await (await backend.start(spec())).stop()  # warm-up: networks, image lookups, bwrap probe
    for _ in range(rounds):
        t0 = time.perf_counter()
        sandbox = await backend.start(spec())
        t1 = time.perf_counter()
        for _ in range(3):
            e0 = time.perf_counter()
            result = await sandbox.exec(["true"])
            execs.append(time.perf_counter() - e0)
            if not result.ok:
                raise SandboxError(f"exec failed: {result}")
        t2 = time.perf_counter()
        await sandbox.stop()
        stops.append(time.perf_counter() - t2)
        starts.append(t1 - t0)
    return {
        "start": statistics.median(starts),
        "exec": statistics.median(execs),
        "stop": statistics.median(stops),
    }


async def docker_concurrency(backend, window_s: float, in_flight: int, cap: int) -> tuple[int, float]:
    """How many Docker sandboxes start within `window_s`, keeping `in_flight` starts going at once."""
    started: list = []
    deadline = time.monotonic() + window_s
    begin = time.monotonic()

    async def worker() -> None:
        while time.monotonic() < deadline and len(started) < cap:
            sandbox = await backend.start(spec(cpus=0.1))
            started.append((time.monotonic(), sandbox))

    try:
        await asyncio.gather(*(worker() for _ in range(in_flight)))
    finally:
        in_window = sum(1 for t, _ in started if t <= deadline)
        elapsed = min(time.monotonic(), deadline) - begin
        await asyncio.gather(*(s.stop() for _, s in started), return_exceptions=True)
    return in_window, elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds and a 15 s concurrency window")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--window", type=float, default=None, help="concurrency window in seconds (60)")
    parser.add_argument("--in-flight", type=int, default=8, help="concurrent starts during the window")
    parser.add_argument("--cap", type=int, default=300, help="stop after this many concurrent sandboxes")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 10)
    window = args.window or (15.0 if args.quick else 60.0)
    console = Console()

    backends: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="harbor-rl-bench-") as tmp:
        backends["local"] = get_backend("local", root=Path(tmp) / "local")
        try:
            docker = get_backend("docker")
            await docker.health()
            backends["docker"] = docker
        except SandboxError as exc:
            console.print(f"[yellow]docker skipped: {exc}")
        if os.environ.get("E2B_API_KEY"):
            backends["e2b"] = get_backend("e2b")

        results: dict[str, dict[str, float]] = {}
        for name, backend in backends.items():
            console.print(f"measuring {name} ({rounds} rounds)...")
            try:
                results[name] = await lifecycle(backend, rounds)
            except SandboxError as exc:
                console.print(f"[yellow]{name} failed: {exc}")

        table = Table(title=f"Sandbox lifecycle, median of {rounds} (ratio vs local)")
        for column in ("backend", "start", "exec round-trip", "stop"):
            table.add_column(column, justify="right" if column != "backend" else "left")
        ref = results.get("local")
        for name, r in results.items():
            cells = []
            for key in ("start", "exec", "stop"):
                ratio = f" ({r[key] / ref[key]:.1f}x)" if ref and ref[key] > 0 and name != "local" else ""
                cells.append(f"{r[key] * 1000:.1f} ms{ratio}")
            table.add_row(name, *cells)
        console.print(table)

        if "docker" in backends:
            console.print(f"starting Docker sandboxes for {window:.0f} s, {args.in_flight} at a time...")
            count, elapsed = await docker_concurrency(backends["docker"], window, args.in_flight, args.cap)
            conc = Table(title="Concurrent Docker sandboxes")
            conc.add_column("window")
            conc.add_column("started and running", justify="right")
            conc.add_column("per second", justify="right")
            capped = " (cap reached)" if count >= args.cap else ""
            conc.add_row(f"{window:.0f} s", f"{count}{capped}", f"{count / max(elapsed, 1e-9):.1f}")
            console.print(conc)
            await backends["docker"].aclose()


if __name__ == "__main__":
    asyncio.run(main())
