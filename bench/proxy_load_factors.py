"""Why two loads price a capture proxy differently: OpenEnv's and our CPU per call, one factor at a time.

    python bench/proxy_load_factors.py [--calls 96] [--rounds 3] [--no-install] [--quick]

One agent, sessions of 32 turns, 512 prompt ids at a session's start; each variant below changes one
thing from the first (`baseline`, bench/proxy_peers.py's plain load of the rows before 2026-12-06):

- `baseline`: text history growing per turn, the agent asks for ids and logprobs itself, the engine
  reports a fixed 512-id prompt, an httpx client calling back to back, non-streamed, OpenEnv served
  by uvicorn on uvloop + httptools at warning level (as proxy_peers serves it).
- `pause 10 ms`: the client waits 10 ms between calls (an agent running its tool), so the proxy
  idles between calls.
- `openai SDK`: the client is the openai SDK (`AsyncOpenAI`, replies parsed), back to back.
- `plain body`: the agent does not ask for ids or logprobs (the proxy adds them and strips the reply).
- `top_logprobs 5`: the agent asks for 5 alternatives a token.
- `growing ids`: the engine's prompt ids come from the chat (4 bytes a token), each prompt extending
  the last prompt + completion, instead of a fixed prompt.
- `agent body`: proxy_peers' agent load (a bash tool, tool-call history and tool replies, the engine
  answering tool calls; growing ids; the agent's plain body).
- `agent body, streamed`: the same, streamed.
- `OpenEnv CLI settings` (OpenEnv only): OpenEnv as its CLI serves it where uvloop and httptools are
  absent (`pip install openenv` alone): asyncio + h11, INFO logs and the access log.
- `agent body, SDK, pause 10 ms`: three factors at once (an agent's real pace and client on the agent
  load), and `the same, OpenEnv CLI settings` (OpenEnv only) adds the fourth.

Both proxies run at once pinned to the first core (idle ones cost nothing), the engines and the client
on the second; the variants take turns within each of `--rounds` rounds, and a cell is its median
round's CPU ms per call (the proxy process tree's run time over its calls, bench/_cpu.py). Reported:
each cell and its ratio to the baseline of the same proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
import proxy_peers as pp  # noqa: E402

from bench._cpu import tree_cpu_ms  # noqa: E402

console = Console(width=150)
PROMPT_IDS = 512
TURNS = 32


@dataclass(frozen=True)
class Variant:
    name: str
    engine: str
    """`plain` (fixed prompt ids) or `agent` (ids from the chat, tool calls answered)."""
    agent: Callable[[], object]
    extra: dict
    stream: bool = False
    pause_s: float = 0.0
    sdk: bool = False
    openenv: str = "uvicorn"
    """Which OpenEnv server answers: `uvicorn` (proxy_peers') or `cli` (its CLI's settings)."""
    ours: bool = True


def _plain_agent() -> pp.Agent:
    return pp.Agent(pp.PROMPT_SIZES[PROMPT_IDS])


def _tool_agent() -> pp.ToolAgent:
    return pp.ToolAgent(PROMPT_IDS)


CAPTURE = pp.CAPTURE_PARAMS
VARIANTS = (
    Variant("baseline", "plain", _plain_agent, CAPTURE),
    Variant("pause 10 ms", "plain", _plain_agent, CAPTURE, pause_s=0.010),
    Variant("openai SDK", "plain", _plain_agent, CAPTURE, sdk=True),
    Variant("plain body", "plain", _plain_agent, {}),
    Variant("top_logprobs 5", "plain", _plain_agent, {**CAPTURE, "top_logprobs": 5}),
    Variant("growing ids", "agent", _plain_agent, CAPTURE),
    Variant("agent body", "agent", _tool_agent, {}),
    Variant("agent body, streamed", "agent", _tool_agent, {}, stream=True),
    Variant("OpenEnv CLI settings", "plain", _plain_agent, CAPTURE, openenv="cli", ours=False),
    Variant("agent body, SDK, pause 10 ms", "agent", _tool_agent, {}, pause_s=0.010, sdk=True),
    Variant(
        "the same, OpenEnv CLI settings",
        "agent",
        _tool_agent,
        {},
        pause_s=0.010,
        sdk=True,
        openenv="cli",
        ours=False,
    ),  # fmt: skip
)

_OPENENV_CLI = """
import logging, sys, uvicorn
from openenv.core.harness.capture.server import create_app
port, llm_url, model, admin_key = sys.argv[1:5]
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
app = create_app(llm_url=llm_url, model=model, capture_level="tokens", admin_key=admin_key)
uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="info", loop="asyncio", http="h11")
"""
"""OpenEnv's `main()` (openenv/core/harness/capture/server.py) with the loop and HTTP parser uvicorn
picks when uvloop and httptools are not installed; its log goes to a file, as a service's would."""


def start_openenv_cli(port: int, engine_url: str, core: int | None, logdir: Path) -> subprocess.Popen:
    return peers.start_openenv(
        port, engine_url, pp.MODEL, pp.ADMIN_KEY, core, logdir, _OPENENV_CLI, "openenv-cli"
    )


async def _sdk_call(url: str, key: str, agent, variant: Variant) -> bytes:
    import openai
    import orjson

    body = orjson.loads(agent.body(variant.stream, variant.extra))
    known = {k: body.pop(k) for k in ("model", "messages", "stream", "tools") if k in body}
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(**known, extra_body=body)
        raw.parse()
        return raw.http_response.content


async def measure(url: str, pid: int, mint, variant: Variant, calls: int) -> float:
    """CPU ms per call of the proxy at `url` (process `pid`) over `calls` calls of `variant`."""
    async with httpx.AsyncClient(timeout=300) as client:
        before = tree_cpu_ms(pid)
        done = 0
        while done < calls:
            key, _ = await mint(client)
            agent = variant.agent()
            for _ in range(min(TURNS, calls - done)):
                if variant.sdk:
                    raw = await _sdk_call(url, key, agent, variant)
                else:
                    body = agent.body(variant.stream, variant.extra)
                    raw = await pp.call(client, f"{url}/v1/chat/completions", key, body, variant.stream)
                agent.take(raw, variant.stream)
                done += 1
                if variant.pause_s:
                    await asyncio.sleep(variant.pause_s)
        return (tree_cpu_ms(pid) - before) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=96, help="calls a cell (96)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; a cell is its median round's (3)")
    parser.add_argument("--no-install", action="store_true", help="do not create OpenEnv's venv")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16 calls a cell, one round")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.rounds = 16, 1
    peers.ensure_installed(peers.OPENENV, not args.no_install)
    cores = sorted(os.sched_getaffinity(0))
    proxy_core, engine_core = (cores[0], cores[-1]) if len(cores) >= 2 else (None, None)
    if engine_core is not None:
        os.sched_setaffinity(0, {engine_core})
    logdir = Path(tempfile.mkdtemp(prefix="harbor-load-factors-"))
    procs: list[subprocess.Popen] = []
    try:
        servers: dict[tuple[str, str], tuple[str, int, Callable]] = {}
        for engine in ("plain", "agent"):
            folder = logdir / engine
            folder.mkdir()
            port = pp.free_port()
            procs.append(pp.start_engine(port, engine_core, folder, PROMPT_IDS if engine == "plain" else None,
                                         agent_load=engine == "agent"))  # fmt: skip
            engine_url = f"http://127.0.0.1:{port}"
            for name in ("harbor-rl", "openenv", "cli"):
                port = pp.free_port()
                url = f"http://127.0.0.1:{port}"
                if name == "harbor-rl":
                    proc = pp.start_harbor(port, engine_url, proxy_core, folder)
                    mint = (lambda u: lambda c: pp._mint(u, {"model": pp.MODEL}, c))(url)
                elif name == "openenv":
                    proc = peers.start_openenv(port, engine_url, pp.MODEL, pp.ADMIN_KEY, proxy_core, folder)
                    mint = (lambda u: lambda c: pp._mint(u, {}, c))(url)
                else:
                    proc = start_openenv_cli(port, engine_url, proxy_core, folder)
                    mint = (lambda u: lambda c: pp._mint(u, {}, c))(url)
                procs.append(proc)
                servers[(engine, name)] = (url, proc.pid, mint)
        cells: dict[tuple[str, str], list[float]] = {}

        async def run() -> None:
            for (engine, _name), (url, pid, mint) in servers.items():  # warm-up
                variant = next(v for v in VARIANTS if v.engine == engine)
                await measure(url, pid, mint, variant, 8)
            for r in range(args.rounds):
                for variant in VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]:
                    proxies = ("harbor-rl",) if variant.ours else ()
                    proxies += ("openenv" if variant.openenv == "uvicorn" else "cli",)
                    for name in proxies:
                        url, pid, mint = servers[(variant.engine, name)]
                        label = "openenv" if name == "cli" else name
                        cells.setdefault((variant.name, label), []).append(
                            await measure(url, pid, mint, variant, args.calls)
                        )
                console.log(f"round {r + 1} of {args.rounds} done")

        asyncio.run(run())
    finally:
        for proc in reversed(procs):
            peers.stop(proc)
    table = Table(title=f"CPU ms per call, one agent, {PROMPT_IDS} prompt ids at a session's start, one factor at a time "
                  f"(median of {args.rounds} rounds of {args.calls} calls)")  # fmt: skip
    for col in ("variant", "OpenEnv ms", "OpenEnv vs baseline", "harbor-rl ms", "harbor-rl vs baseline",
                "harbor-rl / OpenEnv"):  # fmt: skip
        table.add_column(col, justify="left" if col == "variant" else "right")
    med = {key: statistics.median(v) for key, v in cells.items()}
    for variant in VARIANTS:
        theirs, ours = med.get((variant.name, "openenv")), med.get((variant.name, "harbor-rl"))
        base_t, base_o = med[("baseline", "openenv")], med[("baseline", "harbor-rl")]
        table.add_row(
            variant.name, f"{theirs:.2f}", f"{theirs / base_t:.2f}x",
            f"{ours:.2f}" if ours is not None else "-", f"{ours / base_o:.2f}x" if ours is not None else "",
            f"{ours / theirs:.2f}x" if ours is not None else "",
        )  # fmt: skip
    console.print(table)
    load = os.getloadavg()
    console.print(f"load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; logs in {logdir}")


if __name__ == "__main__":
    main()
