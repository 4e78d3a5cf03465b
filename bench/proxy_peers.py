"""Capture proxy vs its peers: the same engine imitation and the same agents, direct and through each proxy.

    python bench/proxy_peers.py [--quick] [--targets direct harbor-rl openenv litellm relay harbor-rl-replay]
                                [--no-install]
                                [--prompt-sizes-only] [--load agent|plain]

Targets, one at a time in front of one engine (the prompt-size runs below interleave them):
`direct` (the agents call the engine themselves); `harbor-rl` (our capture proxy: uvicorn + the real
SQLite trace store, each turn committed before its reply completes); `openenv` (OpenEnv's capture
proxy); `litellm` (LiteLLM's proxy, `hosted_vllm/` model, no database). The peers run from venvs of
their own (see bench/peers.py); one that cannot be installed or started is reported in its row.

The engine is `engine.imitation`'s vLLM imitation (64-token completions, logprobs and token ids),
pinned to the second core with the load generator; each proxy is pinned alone to the first core, so
its CPU time is its own. The agents are a coding agent's loop: sessions of 32 turns whose context
grows each turn by the model's reply and a tool output (so each prompt extends the last one's prompt
+ completion, token for token, as a real chat template makes it); 1, 16 and 64 agents at once,
non-streaming and streaming. Capture proxies get the agent's plain body (they add the capture
parameters); `direct` and `litellm` are sent the parameters themselves (logprobs, token ids), since
a client of a plain router must ask for them. Reported: req/s, p50/p99 latency and each proxy's CPU
ms per request (its process tree's threads' run time over the measured window, bench/_cpu.py).

What each returns differs, and is part of its cost: our proxy answers the agent what it asked for
(no ids or logprobs unless asked) and keeps the token-level trace in its store; OpenEnv calls the
engine non-streaming and replays a stream as SSE, keeping the trace in memory; LiteLLM stores nothing
(no database) and passes the engine's ids and logprobs back to the client, which would have to keep
them itself (its streamed replies drop `prompt_token_ids`). The `direct` client parses replies with
ids and logprobs on the engine's core, which is why a proxy that strips them can beat `direct` there.

Then one session of 2,000 turns per target (sequential, non-streaming; the agent compacts its
context every 32 turns, so the work per turn stays the same all along): whether a turn's latency and
CPU grow with the session's length, per tenth of the session.

Then real coding-agent turn sizes (`--prompt-sizes-only` runs just these): prompts of 512 and 16,384
tokens at a session's start, at 1, 16 and 64 agents, with one of two loads (`--load`):
- `agent` (the default since 2026-12-06): what real agents send and what vLLM answers. A chat body with
  a `bash` tool, the history growing each turn by the model's tool call (an assistant message with
  `tool_calls`) and the tool's reply (a `tool` message); the engine answers every call with a tool call
  of 64 tokens, ids and logprobs for every one of them, streamed and not. Its prompt ids come from the
  chat (~4 bytes a token: a 2 KB history is 512 tokens, 76 KB is 16,384), so each prompt extends the
  last prompt + completion; sessions of 16 turns (8 at 64 agents) grow ~125 tokens a turn, and the
  table shows the mean prompt the engine reported. Capture proxies get the agent's plain body (they add
  the capture parameters and strip the reply); `direct` and `relay` are sent the parameters themselves.
- `plain` (the rows before 2026-12-06): a text history of 2 KB or 70 KB growing by the reply and a
  tool output per turn, the agents asking for logprobs and token ids themselves (as a trainer's client
  does), an engine reporting a fixed prompt of 512 or 16,384 ids, non-streamed.
For our proxy it also reports its store: bytes per token (prompt + completion, summed over turns) and
what the request, response and array columns hold. These runs also measure `relay`, the floor under any
capture: a bare uvicorn relay that parses and passes on, capturing and storing nothing; and
`harbor-rl-replay`, our proxy with `--stream-mode replay`, which answers a stream as OpenEnv does (the
engine called unstreamed, the reply replayed as SSE), on the streamed levels only. All targets
of a prompt size run at once (idle ones cost nothing) and take turns level by level, in 3 rounds
(`--size-rounds`; 1 with --quick), so that a slow phase of a shared machine falls on all of them:
a level's CPU is its median round's, and CPU ratios are the median of the ratios within a round.
bench/proxy_load_factors.py explains the difference between the two loads one factor at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402  (bench/peers.py, a sibling: this file runs as a script)

from bench._clients import agent_clients  # noqa: E402
from bench._cpu import tree_cpu_ms  # noqa: E402

MODEL = "imitation-model"
ADMIN_KEY = "bench-admin-key-0123456789"
COMPLETION_TOKENS = 64
TURNS_PER_SESSION = 32
QUICK_TURNS = 8
"""--quick: turns of each session in the main runs."""
LONG_SESSION_TURNS = 2000
QUICK_LONG_TURNS = 200
TARGETS = ("direct", "harbor-rl", "openenv", "litellm")
CAPTURE_PARAMS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
"""What a client must ask an engine (or a plain router) for to train on the reply."""
SYSTEM = "You are a coding agent. Use the bash tool to inspect and fix the repository."
TASK = "The test suite fails in tests/test_parser.py; find the bug and fix it. Run pytest when done."
TOOL_OUTPUT = (
    "$ pytest -q tests/test_parser.py\n"
    + "F.F..  [100%]\nFAILED tests/test_parser.py::test_quoted - AssertionError: expected 'a b'\n" * 2
)

AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    }
]
"""The agent load's one tool, as mini-swe-agent's and opencode's bash tools are declared."""
BYTES_PER_TOKEN = 4
"""The agent load's engine tokenizes ~4 bytes a token (a real BPE's rate; ids of up to 6 digits)."""


def _tool_arguments(tokens: int) -> str:
    """A bash call's arguments sized so the whole tool call (hermes markup included) is `tokens` tokens
    with the EOS, every one of them with its id and logprob in the engine's reply."""
    markup = len('<tool_call>{"name": "bash", "arguments": }</tool_call>') + len('{"command": ""}')
    command = (
        "cd /repo && python -m pytest -q tests/test_parser.py -x 2>&1 | tail -n 40 && git diff --stat; " * 4
    )
    return '{"command": "' + command[: (tokens - 1) * BYTES_PER_TOKEN - markup] + '"}'


TOOL_ARGUMENTS = _tool_arguments(COMPLETION_TOKENS)

console = Console(width=170)


@dataclass
class Target:
    name: str
    url: str
    pid: int | None
    """The process whose tree's CPU time is the proxy's (None for direct)."""
    mint: Callable[[httpx.AsyncClient], Awaitable[tuple[str, str]]]
    """Opens a new agent session: (API key, session id or "")."""
    extra: dict = field(default_factory=dict)
    """Fields the agent adds to each body for this target."""
    streams: tuple[bool, ...] = (False, True)
    """The levels it runs: non-streamed, streamed or both (harbor-rl-replay differs only streamed)."""


@dataclass
class Level:
    stream: bool
    agents: int
    requests: int = 0
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu_ms: float | None = None
    cpu_rounds: list[float] = field(default_factory=list)
    """CPU ms per request of each round, in round order (prompt-size levels measured in rounds)."""
    failed: int = 0
    first_failure: str = ""
    prompt_tokens: list[int] = field(default_factory=list)
    """The prompt's tokens of each call whose reply said (its usage)."""


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_harbor(port: int, upstream: str, store_url: str, stream_mode: str = "relay") -> None:
    """Our proxy's process: the same app `harbor proxy --stream-mode MODE` serves."""
    import uvicorn

    from capture_proxy.app import create_app
    from capture_proxy.config import ProxyConfig
    from capture_proxy.store import TraceStore

    config = ProxyConfig(upstream_url=upstream, admin_key=ADMIN_KEY, stream_mode=stream_mode)
    app = create_app(config, TraceStore(store_url), close_store=True)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=75
    )


def serve_relay(port: int, upstream: str) -> None:
    """The floor under any Python capture proxy on this stack (the prompt-size runs' `relay`): uvicorn
    and a bare ASGI app that reads the agent's body, parses it and the engine's reply (as any capture
    must), and passes the reply on over the engine transport our proxy uses. No session, no capture,
    no store: what is left of our proxy's CPU above this row is what capturing costs. A streamed call
    is relayed read by read, each of its events parsed."""
    import uvicorn

    from capture_proxy.transport import FastHTTPTransport, request_head

    url = httpx.URL(upstream)
    key = (url.host, url.port or 80)
    head = request_head("POST", *key, "/v1/chat/completions", {"content-type": "application/json"})
    transport = FastHTTPTransport()
    client = httpx.AsyncClient(transport=transport, timeout=300)

    async def relay_stream(sent: bytes, send) -> None:
        """A streamed call: each read of the engine's SSE passed on as it comes, its events parsed."""
        request = client.build_request("POST", f"{upstream}/v1/chat/completions", content=sent,
                                       headers={"content-type": "application/json"})  # fmt: skip
        reply = await client.send(request, stream=True)
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        rest = b""
        async for data in reply.stream:
            *events, rest = (rest + data).split(b"\n\n")
            for event in events:
                if event.startswith(b"data: ") and event != b"data: [DONE]":
                    orjson.loads(event[6:])
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await reply.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        out = b'{"status":"ok"}'
        if scope["path"] == "/v1/chat/completions":
            parsed = orjson.loads(body)
            sent = orjson.dumps(parsed)
            if parsed.get("stream"):
                await relay_stream(sent, send)
                return
            reply = await transport.post(key, head, sent, connect_timeout=10, read_timeout=300)
            orjson.loads(reply.content)
            out = reply.content
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=75
    )


def start_engine(
    port: int, core: int | None, logdir: Path, prompt_ids: int | None = None, agent_load: bool = False
) -> subprocess.Popen:
    """The engine imitation: a fixed prompt of `prompt_ids` ids (the plain load's prompt-size runs),
    or, for the agent load, prompts tokenized from the chat (BYTES_PER_TOKEN bytes a token) and every
    tool call COMPLETION_TOKENS tokens."""
    args = [sys.executable, "-m", "engine.imitation", "--port", str(port), "--model", MODEL,
            "--completion-tokens", str(COMPLETION_TOKENS)]  # fmt: skip
    if prompt_ids is not None:
        args += ["--prompt-tokens", str(prompt_ids)]
    if agent_load:
        args += ["--bytes-per-token", str(BYTES_PER_TOKEN), "--tool-arguments", TOOL_ARGUMENTS]
    with (logdir / "engine.log").open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})))  # fmt: skip
    peers.wait_healthy(proc, f"http://127.0.0.1:{port}/health", "the engine imitation", logdir / "engine.log")
    return proc


def start_harbor(
    port: int, engine_url: str, core: int | None, logdir: Path, stream_mode: str = "relay"
) -> subprocess.Popen:
    log = logdir / "harbor.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-harbor", str(port), engine_url, f"sqlite:///{logdir}/traces.db",
             stream_mode],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})),
        )  # fmt: skip
    peers.wait_healthy(proc, f"http://127.0.0.1:{port}/health", "our capture proxy", log)
    return proc


def start_relay(port: int, engine_url: str, core: int | None, logdir: Path) -> subprocess.Popen:
    log = logdir / "relay.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-relay", str(port), engine_url],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})),
        )  # fmt: skip
    peers.wait_healthy(proc, f"http://127.0.0.1:{port}/health", "the bare relay", log)
    return proc


async def _mint(url: str, payload: dict, client: httpx.AsyncClient) -> tuple[str, str]:
    """A new capture session: (the agent's API key, the session id)."""
    r = await client.post(f"{url}/sessions", json=payload, headers={"authorization": f"Bearer {ADMIN_KEY}"})
    if r.status_code not in (200, 201):
        raise RuntimeError(f"POST {url}/sessions answered {r.status_code}: {r.text[:300]}")
    created = r.json()
    return created.get("api_key") or created["session_id"], created["session_id"]


async def _no_session(client: httpx.AsyncClient) -> tuple[str, str]:
    return ADMIN_KEY, ""  # direct ignores the key; for LiteLLM it is the master key


async def captured_turns(target: Target, session_id: str, client: httpx.AsyncClient) -> int | None:
    """How many turns the proxy says it recorded for a session (None: it records none)."""
    if not session_id:
        return None
    r = await client.get(
        f"{target.url}/sessions/{session_id}", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    r.raise_for_status()
    info = r.json()
    return info.get("num_turns", info.get("n_turns"))


# -- the agents -----------------------------------------------------------------------------------


def sse_events(raw: bytes) -> Iterator[dict]:
    """The events of an SSE stream, [DONE] left out; an error event raises."""
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = orjson.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"stream error event: {event['error']}")
        yield event


def reply_text(raw: bytes, stream: bool) -> str:
    """The assistant's text, from a JSON reply or an SSE stream."""
    if not stream:
        return orjson.loads(raw)["choices"][0]["message"]["content"] or ""
    parts = []
    for event in sse_events(raw):
        for choice in event.get("choices") or ():
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def history(kb: int) -> list[dict]:
    """A coding agent's conversation of about `kb` KB as JSON: the task, then commands and their output."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    while len(orjson.dumps(messages)) < kb * 1024:
        messages.append(
            {"role": "assistant", "content": "Running the failing test again after the edit. " * 4}
        )
        messages.append({"role": "user", "content": TOOL_OUTPUT})
    return messages


class Agent:
    """One agent's conversation: turns extend the context; `compact()` starts it over."""

    def __init__(self, history_kb: int = 0) -> None:
        self.history_kb = history_kb
        self.compact()

    def compact(self) -> None:
        self.messages = history(self.history_kb)

    def body(self, stream: bool, extra: dict) -> bytes:
        return orjson.dumps({"model": MODEL, "messages": self.messages, "stream": stream, **extra})

    def observe(self, reply: str) -> None:
        self.messages.append({"role": "assistant", "content": reply})
        self.messages.append({"role": "user", "content": TOOL_OUTPUT})

    def take(self, raw: bytes, stream: bool) -> int | None:
        """The reply into the context; the prompt's tokens when the reply says (None for this load)."""
        self.observe(reply_text(raw, stream))
        return None


def reply_message(raw: bytes, stream: bool) -> tuple[dict, int | None]:
    """The assistant message (content and tool calls, as a client's SDK assembles them) from a JSON
    reply or an SSE stream, and the prompt's tokens from its usage when it has one."""
    if not stream:
        reply = orjson.loads(raw)
        message = reply["choices"][0]["message"]
        return message, (reply.get("usage") or {}).get("prompt_tokens")
    content: list[str] = []
    calls: dict[int, dict] = {}
    prompt_tokens = None
    for event in sse_events(raw):
        prompt_tokens = (event.get("usage") or {}).get("prompt_tokens", prompt_tokens)
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or ():
                call = calls.setdefault(tc.get("index", 0), {"id": "", "type": "function",
                                                             "function": {"name": "", "arguments": ""}})  # fmt: skip
                call["id"] = tc.get("id") or call["id"]
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
    message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, prompt_tokens


_AGENT_HISTORIES: dict[int, list[dict]] = {}


def agent_history(prompt_ids: int) -> list[dict]:
    """A coding agent's conversation whose chat prompt is `prompt_ids` tokens on the agent load's engine
    (to within one token): the task, then bash calls and their output, the task padded to the size."""
    from engine.imitation import chat_prompt_ids, render_message

    if prompt_ids not in _AGENT_HISTORIES:
        k = BYTES_PER_TOKEN
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        size = len(chat_prompt_ids(messages, AGENT_TOOLS, k))
        n = 0
        while True:
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": "bash", "arguments": TOOL_ARGUMENTS},
            }
            pair = [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"call_{n}", "content": TOOL_OUTPUT}]  # fmt: skip
            grows = sum(len(render_message(m, k)) for m in pair)
            if size + grows > prompt_ids:
                break
            messages += pair
            size += grows
            n += 1
        note = " Notes so far: the parser splits quoted arguments on spaces inside the quotes."
        task = TASK + (note * (1 + (prompt_ids - size) * k // len(note)))[: (prompt_ids - size) * k]
        messages[1] = {"role": "user", "content": task}
        _AGENT_HISTORIES[prompt_ids] = messages
    return list(_AGENT_HISTORIES[prompt_ids])


class ToolAgent:
    """The agent load: a coding agent with a bash tool, whose context grows each turn by the model's
    tool call (an assistant message with `tool_calls`, replayed as the model wrote it) and the tool's
    reply (a `tool` message), as real agents send it; the reply may be streamed or not."""

    def __init__(self, prompt_ids: int) -> None:
        self.prompt_ids = prompt_ids
        self.compact()

    def compact(self) -> None:
        self.messages = agent_history(self.prompt_ids)

    def body(self, stream: bool, extra: dict) -> bytes:
        return orjson.dumps({"model": MODEL, "messages": self.messages, "tools": AGENT_TOOLS, "stream": stream,
                             **extra})  # fmt: skip

    def take(self, raw: bytes, stream: bool) -> int | None:
        message, prompt_tokens = reply_message(raw, stream)
        calls = message.get("tool_calls") or []
        if not calls:
            raise RuntimeError(f"the agent load expects a tool call, got {str(message)[:200]}")
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["function"]["name"],
                  "arguments": c["function"]["arguments"]}} for c in calls]  # fmt: skip
        self.messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for c in calls:
            self.messages.append({"role": "tool", "tool_call_id": c["id"], "content": TOOL_OUTPUT})
        return prompt_tokens


async def call(client: httpx.AsyncClient, url: str, key: str, body: bytes, stream: bool) -> bytes:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if stream:
        chunks = []
        async with client.stream("POST", url, content=body, headers=headers) as r:
            async for chunk in r.aiter_raw():
                chunks.append(chunk)
        raw = b"".join(chunks)
    else:
        r = await client.post(url, content=body, headers=headers)
        raw = r.content
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {raw[:300]!r}")
    return raw


async def run_level(
    target: Target, stream: bool, agents: int, sessions_per_agent: int, turns: int = TURNS_PER_SESSION
) -> Level:
    """`agents` agents at once, each running `sessions_per_agent` sessions of `turns` turns."""
    level = Level(stream, agents)
    url = f"{target.url}/v1/chat/completions"

    async def agent_loop(client: httpx.AsyncClient) -> None:
        agent = Agent()
        for _ in range(sessions_per_agent):
            key, _ = await target.mint(client)
            agent.compact()
            for _ in range(turns):
                if not await timed_turn(level, client, url, key, agent, stream, target.extra):
                    break  # the session is broken; start the next one

    await run_agents(level, target, agent_loop, agents)
    return level


async def timed_turn(
    level: Level, client: httpx.AsyncClient, url: str, key: str, agent: Agent, stream: bool, extra: dict
) -> bool:
    """One agent turn (its body built inside the timing, as the agent's own cost), its latency added to
    `level`; False, counted as failed, when it broke."""
    t0 = time.perf_counter()
    try:
        raw = await call(client, url, key, agent.body(stream, extra), stream)
        prompt_tokens = agent.take(raw, stream)
        latency = time.perf_counter() - t0
    except (httpx.HTTPError, RuntimeError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
        level.failed += 1
        level.first_failure = level.first_failure or repr(exc)[:300]
        return False
    level.latencies.append(latency)
    if prompt_tokens is not None:
        level.prompt_tokens.append(prompt_tokens)
    return True


async def run_agents(
    level: Level, target: Target, agent_loop: Callable[[httpx.AsyncClient], Awaitable[None]], agents: int
) -> None:
    """`agents` copies of `agent_loop` at once, each with its own client (bench/_clients.py); the level's
    wall time, requests and target CPU per request."""
    async with agent_clients(agents, 300) as clients:
        before = tree_cpu_ms(target.pid) if target.pid else 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(agent_loop(client) for client in clients))
        level.wall_s = time.perf_counter() - t0
    level.requests = len(level.latencies)
    if target.pid and level.requests:
        level.cpu_ms = (tree_cpu_ms(target.pid) - before) / level.requests


async def long_session(target: Target, turns: int) -> tuple[list[tuple[float, float | None]], int | None]:
    """One session of `turns` sequential calls: per tenth (median ms per turn, proxy CPU ms per turn),
    and the turns the proxy says it captured."""
    url = f"{target.url}/v1/chat/completions"
    out: list[tuple[float, float | None]] = []
    async with httpx.AsyncClient(timeout=300) as client:
        key, session_id = await target.mint(client)
        agent = Agent()
        done = 0
        for _ in range(10):
            lat = []
            before = tree_cpu_ms(target.pid) if target.pid else 0.0
            for _ in range(turns // 10):
                if done and done % TURNS_PER_SESSION == 0:
                    agent.compact()
                t0 = time.perf_counter()
                raw = await call(client, url, key, agent.body(False, target.extra), False)
                agent.observe(reply_text(raw, False))
                lat.append(time.perf_counter() - t0)
                done += 1
            cpu = (tree_cpu_ms(target.pid) - before) / len(lat) if target.pid else None
            out.append((statistics.median(lat) * 1000, cpu))
        return out, await captured_turns(target, session_id, client)


# -- one target -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    version: str = ""
    note: str = ""
    levels: list[Level] = field(default_factory=list)
    tenths: list[tuple[float, float | None]] = field(default_factory=list)
    captured: int | None = None
    """Turns the proxy reported for the long session."""


def plan(quick: bool, agents: list[int] | None = None) -> dict[int, int]:
    """Agents -> sessions (of 32 turns) per agent."""
    default = {1: 1, 16: 1, 64: 1} if quick else {1: 8, 16: 2, 64: 1}
    return {n: default.get(n, 1) for n in agents} if agents else default


async def measure(
    target: Target, quick: bool, long_turns: int, agents: list[int] | None
) -> tuple[list[Level], list, int | None]:
    await run_level(target, False, 4, 1)  # warm-up: connections, imports, the store's first writes
    levels = []
    for stream in (False, True):
        for n, sessions in plan(quick, agents).items():
            level = await run_level(target, stream, n, sessions, QUICK_TURNS if quick else TURNS_PER_SESSION)
            rate = level.requests / level.wall_s if level.wall_s else 0
            cpu = f", {level.cpu_ms:.2f} ms CPU/req" if level.cpu_ms is not None else ""
            console.log(
                f"{target.name} stream={stream} agents={n}: {rate:.0f} req/s{cpu}, {level.failed} failed"
            )
            levels.append(level)
    console.log(f"{target.name}: one session of {long_turns} turns")
    tenths, captured = await long_session(target, long_turns)
    return levels, tenths, captured


def run_target(name: str, engine_url: str, proxy_core: int | None, quick: bool, install: bool,
               long_turns: int, logdir: Path, agents: list[int] | None = None) -> Outcome:  # fmt: skip
    outcome = Outcome(name)
    proc = None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    try:
        if name == "direct":
            target = Target(name, engine_url, None, _no_session, dict(CAPTURE_PARAMS))
            outcome.version = "-"
        elif name == "harbor-rl":
            proc = start_harbor(port, engine_url, proxy_core, logdir)
            outcome.version = "0.1.0 (this tree)"
            target = Target(name, url, proc.pid, lambda c: _mint(url, {"model": MODEL}, c))
        elif name == "openenv":
            outcome.version = peers.ensure_installed(peers.OPENENV, install)
            proc = peers.start_openenv(port, engine_url, MODEL, ADMIN_KEY, proxy_core, logdir)
            target = Target(name, url, proc.pid, lambda c: _mint(url, {}, c))
        elif name == "litellm":
            outcome.version = peers.ensure_installed(peers.LITELLM, install)
            proc = peers.start_litellm(port, engine_url, MODEL, ADMIN_KEY, proxy_core, logdir)
            target = Target(name, url, proc.pid, _no_session, dict(CAPTURE_PARAMS))
        else:
            raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGETS)}")
        console.log(f"measuring {name} ({outcome.version})")
        outcome.levels, outcome.tenths, outcome.captured = asyncio.run(
            measure(target, quick, long_turns, agents)
        )
    except peers.PeerUnavailable as exc:
        outcome.note = f"not run: {exc}"
        console.log(f"[yellow]{name}: {outcome.note}")
    except Exception as exc:  # one target failing is reported in its row; the others still run
        outcome.note = f"failed: {exc!r}"[:400]
        console.log(f"[red]{name}: {outcome.note}")
    finally:
        peers.stop(proc)
    return outcome


# -- real turn sizes ------------------------------------------------------------------------------

PROMPT_SIZES = {512: 2, 16_384: 70}
"""Prompt ids at a session's start -> KB of history the plain load's agents send (the agent load's
history is sized in the engine's tokens, ~4 bytes each: about the same KB)."""
SIZE_PLAN = {1: (4, 48), 16: (1, 24), 64: (1, 8)}
"""The plain load: agents -> (sessions per agent, turns per session) at each prompt size."""
AGENT_SIZE_PLAN = {1: (12, 16), 16: (1, 16), 64: (1, 8)}
"""The agent load: sessions of 16 turns (8 at 64 agents); each turn adds ~120 tokens (the tool call
and its output), so a session's prompts run from its start to ~1.8k tokens above it."""
QUICK_SIZE_PLAN = {1: (1, 16), 16: (1, 4), 64: (1, 2)}
"""--quick: a few calls a level (a check that the runs work; numbers are indicative only)."""
SIZE_TARGETS = ("direct", "relay", "harbor-rl", "harbor-rl-replay", "openenv")
"""`relay` (serve_relay) and `harbor-rl-replay` (our proxy with `--stream-mode replay`, streamed levels
only: it answers a stream as OpenEnv does) are for the prompt-size runs only."""
SIZE_ROUNDS = 3
"""Rounds of each prompt-size level (interleaved_levels); a level's CPU is its median round's."""
LOADS = ("agent", "plain")
LOAD_TITLES = {
    "agent": "the agent load: chat body with a bash tool, history growing by tool calls and tool replies, "
    "capture proxies sent the agent's plain body, the engine's reply carrying ids and logprobs of every "
    "completion token; streamed and not",
    "plain": "the plain load: agents asking for ids and logprobs themselves, text history growing per turn, "
    "fixed prompt ids, non-streamed",
}


@dataclass
class SizeOutcome:
    prompt_ids: int
    name: str
    note: str = ""
    levels: list[Level] = field(default_factory=list)
    store: dict = field(default_factory=dict)
    """Our proxy's store after the runs: turns, bytes, and per column group."""


def size_plan(load: str, quick: bool) -> dict[int, tuple[int, int]]:
    return QUICK_SIZE_PLAN if quick else AGENT_SIZE_PLAN if load == "agent" else SIZE_PLAN


async def run_size_level(
    target: Target, load: str, prompt_ids: int, stream: bool, agents: int, turns: int, sessions: int = 1
) -> Level:
    """`agents` agents at once, each `sessions` sessions of `turns` turns (each session starting from
    the same history). On the plain load every agent asks for ids and logprobs itself; on the agent
    load only where no capture proxy adds them (`direct`, `relay`: Target.extra)."""
    level = Level(stream, agents)
    url = f"{target.url}/v1/chat/completions"
    extra = CAPTURE_PARAMS if load == "plain" else target.extra

    async def agent_loop(client: httpx.AsyncClient) -> None:
        for _ in range(sessions):
            agent = Agent(PROMPT_SIZES[prompt_ids]) if load == "plain" else ToolAgent(prompt_ids)
            key, _ = await target.mint(client)
            for _ in range(turns):
                if not await timed_turn(level, client, url, key, agent, stream, extra):
                    return

    await run_agents(level, target, agent_loop, agents)
    return level


def store_stats(db: Path, prompt_ids: float) -> dict:
    """What our proxy's SQLite store holds after a prompt-size run (WAL checkpointed into the file);
    tokens counted as turns x (`prompt_ids`, the mean prompt, + the completion)."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        turns, request, response, arrays, meta = conn.execute(
            "SELECT count(*), sum(length(request)), sum(length(response)), sum(length(prompt_ids) + "
            "length(completion_ids) + length(logps) + length(loss_mask)), sum(length(metadata)) FROM turns"
        ).fetchone()
    tokens = round(turns * (prompt_ids + COMPLETION_TOKENS))
    return {"turns": turns, "tokens": tokens, "bytes": db.stat().st_size, "request": request or 0,
            "response": response or 0, "arrays": arrays or 0, "metadata": meta or 0}  # fmt: skip


def start_size_target(name: str, prompt_ids: int, engine_url: str, proxy_core: int | None, install: bool,
                      logdir: Path) -> tuple[SizeOutcome, Target | None, subprocess.Popen | None]:  # fmt: skip
    """Start one target for the prompt-size runs: its outcome (noting why, if it could not start), the
    target, and its process to stop afterwards."""
    outcome = SizeOutcome(prompt_ids, name)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = logdir / f"prompt-{prompt_ids}-{name}"
    folder.mkdir(exist_ok=True)
    proc = None
    try:
        if name == "direct":
            return outcome, Target(name, engine_url, None, _no_session, dict(CAPTURE_PARAMS)), None
        if name in ("harbor-rl", "harbor-rl-replay"):
            replay = name == "harbor-rl-replay"
            proc = start_harbor(port, engine_url, proxy_core, folder, "replay" if replay else "relay")
            target = Target(name, url, proc.pid, lambda c: _mint(url, {"model": MODEL}, c))
            if replay:
                target.streams = (True,)
            return outcome, target, proc
        if name == "openenv":
            peers.ensure_installed(peers.OPENENV, install)
            proc = peers.start_openenv(port, engine_url, MODEL, ADMIN_KEY, proxy_core, folder)
            return outcome, Target(name, url, proc.pid, lambda c: _mint(url, {}, c)), proc
        if name == "relay":
            proc = start_relay(port, engine_url, proxy_core, folder)
            return outcome, Target(name, url, proc.pid, _no_session, dict(CAPTURE_PARAMS)), proc
        raise ValueError(f"the prompt-size runs measure {', '.join(SIZE_TARGETS)}, not {name!r}")
    except peers.PeerUnavailable as exc:
        outcome.note = f"not run: {exc}"
    except Exception as exc:  # reported in its row; the others still run
        outcome.note = f"failed: {exc!r}"[:400]
        console.log(f"[red]{name} at {prompt_ids} prompt ids: {outcome.note}")
    peers.stop(proc)
    return outcome, None, None


def merge_rounds(rounds: list[Level]) -> Level:
    """One level from its rounds: their requests, wall time and latencies pooled; CPU per request the
    median round's, so one round caught in a slow phase of a shared machine does not decide it."""
    merged = Level(rounds[0].stream, rounds[0].agents)
    for lv in rounds:
        merged.requests += lv.requests
        merged.wall_s += lv.wall_s
        merged.latencies += lv.latencies
        merged.prompt_tokens += lv.prompt_tokens
        merged.failed += lv.failed
        merged.first_failure = merged.first_failure or lv.first_failure
    merged.cpu_rounds = [lv.cpu_ms for lv in rounds if lv.cpu_ms is not None]
    merged.cpu_ms = statistics.median(merged.cpu_rounds) if merged.cpu_rounds else None
    return merged


def cpu_ratio(ours: Level, theirs: Level, floor: Level | None = None) -> float | None:
    """Our CPU per request over theirs, each less `floor`'s when given. Levels measured in the same
    rounds give the median of the per-round ratios (each round ran its targets side by side); others
    the ratio of their CPU."""
    levels = [ours, theirs, *([floor] if floor else [])]
    counts = {len(lv.cpu_rounds) for lv in levels}
    if len(counts) == 1 and 0 not in counts:
        samples = list(zip(*(lv.cpu_rounds for lv in levels), strict=True))
    elif all(lv.cpu_ms is not None for lv in levels):
        samples = [tuple(lv.cpu_ms for lv in levels)]
    else:
        return None
    ratios = []
    for sample in samples:
        base = sample[2] if floor else 0.0
        if sample[1] > base:
            ratios.append((sample[0] - base) / (sample[1] - base))
    return statistics.median(ratios) if ratios else None


async def interleaved_levels(
    targets: list[Target], load: str, prompt_ids: int, rounds: int, plan: dict[int, tuple[int, int]],
    streams: tuple[bool, ...] = (False,),
) -> dict[str, list[Level]]:  # fmt: skip
    """Every level of `plan`, for each of `streams`, `rounds` times, the targets taking turns (each
    round starts with the next one): the CPU the verdict compares is measured seconds apart, not a
    minute apart, so the machine's slow phases fall on every target alike."""
    for target in targets:
        await run_size_level(target, load, prompt_ids, False, 4, 3)  # warm-up
    out: dict[str, list[Level]] = {t.name: [] for t in targets}
    for stream in streams:
        for agents, (sessions, turns) in plan.items():
            active = [t for t in targets if stream in t.streams]
            per_round: dict[str, list[Level]] = {t.name: [] for t in active}
            for r in range(rounds):
                for target in active[r % len(active) :] + active[: r % len(active)]:
                    per_round[target.name].append(
                        await run_size_level(target, load, prompt_ids, stream, agents, turns, sessions)
                    )
            for name, levels in per_round.items():
                level = merge_rounds(levels)
                cpu = f", {level.cpu_ms:.2f} ms CPU/req" if level.cpu_ms is not None else ""
                console.log(f"{name} stream={stream} {agents} agents: {level.requests / level.wall_s:.0f} req/s"
                            f"{cpu}, {level.failed} failed ({rounds} rounds)")  # fmt: skip
                out[name].append(level)
    return out


def run_sizes(targets: list[str], proxy_core: int | None, engine_core: int | None, install: bool,
              logdir: Path, rounds: int, load: str = "agent", quick: bool = False) -> list[SizeOutcome]:  # fmt: skip
    outcomes = []
    plan = size_plan(load, quick)
    streams = (False, True) if load == "agent" else (False,)
    for prompt_ids in PROMPT_SIZES:
        port = free_port()
        engine_url = f"http://127.0.0.1:{port}"
        engine = start_engine(
            port, engine_core, logdir, None if load == "agent" else prompt_ids, agent_load=load == "agent"
        )
        started = [
            start_size_target(name, prompt_ids, engine_url, proxy_core, install, logdir)
            for name in SIZE_TARGETS
            if name in targets
        ]
        try:
            running = [target for _, target, _ in started if target is not None]
            if running:
                levels = asyncio.run(interleaved_levels(running, load, prompt_ids, rounds, plan, streams))
                for outcome, target, _ in started:
                    if target is not None:
                        outcome.levels = levels[target.name]
        except Exception as exc:  # reported in every row of this size; the other size still runs
            for outcome, target, _ in started:
                if target is not None:
                    outcome.note = f"failed: {exc!r}"[:400]
            console.log(f"[red]{prompt_ids} prompt ids: {exc!r}")
        finally:
            for _, _, proc in started:
                peers.stop(proc)
            peers.stop(engine)
        db = logdir / f"prompt-{prompt_ids}-harbor-rl" / "traces.db"
        mean = mean_prompt([o for o, _, _ in started], prompt_ids) if load == "agent" else prompt_ids
        for outcome, _, _ in started:
            if outcome.name == "harbor-rl" and db.exists():
                outcome.store = store_stats(db, mean or prompt_ids)
        outcomes += [outcome for outcome, _, _ in started]
    return outcomes


def mean_prompt(outcomes: list[SizeOutcome], prompt_ids: int, agents: int | None = None) -> float | None:
    """The mean prompt tokens the engine reported (replies' usage) at a size, over every target's
    levels (or those of `agents` agents)."""
    seen = [t for o in outcomes if o.prompt_ids == prompt_ids for lv in o.levels
            if agents is None or lv.agents == agents for t in lv.prompt_tokens]  # fmt: skip
    return statistics.fmean(seen) if seen else None


def size_table(outcomes: list[SizeOutcome], load: str = "agent") -> Table:
    table = Table(title=f"Real turn sizes, {LOAD_TITLES[load]}")
    size_col = "mean prompt ids" if load == "agent" else "history KB"
    for col in ("prompt ids", size_col, "stream", "agents", "target", "req/s", "vs direct", "p50 ms", "p99 ms",
                "added p50 ms", "added p99 ms", "CPU ms/req", "CPU vs openenv", "above relay vs openenv",
                "failed", "note"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("target", "note") else "right")
    find = {(o.prompt_ids, o.name): o for o in outcomes}
    for o in outcomes:
        if not o.levels:
            table.add_row(str(o.prompt_ids), "", "", "-", o.name, *[""] * 10, o.note[:160] or "no result")
            continue
        for lv in o.levels:
            d = _level(find.get((o.prompt_ids, "direct")), lv.agents, lv.stream)
            peer = _level(find.get((o.prompt_ids, "openenv")), lv.agents, lv.stream)
            relay = _level(find.get((o.prompt_ids, "relay")), lv.agents, lv.stream)
            vs_peer = cpu_ratio(lv, peer) if peer else None
            above = (
                cpu_ratio(lv, peer, relay)
                if peer and relay and o.name not in ("direct", "relay", "harbor-rl-replay")
                else None
            )
            rate = lv.requests / lv.wall_s
            added = o.name != "direct" and d is not None
            if load == "agent":
                mean = mean_prompt(outcomes, o.prompt_ids, lv.agents)
                size = f"{mean:.0f}" if mean else ""
            else:
                size = str(PROMPT_SIZES[o.prompt_ids])
            table.add_row(
                str(o.prompt_ids), size, "yes" if lv.stream else "no", str(lv.agents), o.name, f"{rate:.0f}",
                f"{rate / (d.requests / d.wall_s):.2f}x" if d else "",
                f"{pct(lv.latencies, 0.5):.2f}", f"{pct(lv.latencies, 0.99):.2f}",
                f"{pct(lv.latencies, 0.5) - pct(d.latencies, 0.5):+.2f}" if added else "",
                f"{pct(lv.latencies, 0.99) - pct(d.latencies, 0.99):+.2f}" if added else "",
                f"{lv.cpu_ms:.2f}" if lv.cpu_ms is not None else "-",
                f"{vs_peer:.2f}x" if vs_peer is not None else "", f"{above:.2f}x" if above is not None else "",
                str(lv.failed), lv.first_failure[:80] if lv.failed else "",
            )  # fmt: skip
    return table


def _level(outcome: SizeOutcome | None, agents: int, stream: bool = False) -> Level | None:
    lv = (
        next((x for x in outcome.levels if (x.agents, x.stream) == (agents, stream)), None)
        if outcome
        else None
    )
    return lv if lv is not None and lv.requests else None


def store_table(outcomes: list[SizeOutcome], load: str = "agent") -> Table:
    table = Table(
        title=f"Our proxy's store after the turn-size runs ({load} load; SQLite file, WAL checkpointed)"
    )
    for col in ("prompt ids", "turns", "M tokens", "MB", "bytes/token", "request MB", "response MB",
                "arrays MB", "metadata MB"):  # fmt: skip
        table.add_column(col, justify="right")
    for o in outcomes:
        st = o.store
        if not st or not st["turns"]:
            continue
        table.add_row(
            str(o.prompt_ids), str(st["turns"]), f"{st['tokens'] / 1e6:.2f}", f"{st['bytes'] / 1e6:.1f}",
            f"{st['bytes'] / st['tokens']:.2f}", f"{st['request'] / 1e6:.2f}", f"{st['response'] / 1e6:.2f}",
            f"{st['arrays'] / 1e6:.2f}", f"{st['metadata'] / 1e6:.2f}",
        )  # fmt: skip
    return table


def size_verdict(outcomes: list[SizeOutcome], load: str = "agent") -> list[str]:
    """The turn-size targets: CPU at most a third of OpenEnv's at both sizes, every level; at 64 agents
    at least 0.9 of direct's req/s at both sizes; at 16k ids and one agent at most 10 ms added p99;
    at most 1.5 bytes per token in the store at 16k ids. Streamed and non-streamed levels apart."""
    find = {(o.prompt_ids, o.name): o for o in outcomes}
    lines = [f"targets on {load} load:"]
    for prompt_ids in PROMPT_SIZES:
        ours, peer = find.get((prompt_ids, "harbor-rl")), find.get((prompt_ids, "openenv"))
        if not ours or not ours.levels:
            lines.append(f"{prompt_ids} ids: harbor-rl not measured")
            continue
        direct, relay = find.get((prompt_ids, "direct")), find.get((prompt_ids, "relay"))
        replay = find.get((prompt_ids, "harbor-rl-replay"))
        streams = sorted({lv.stream for lv in ours.levels})
        variants = [(ours, stream, "streamed" if stream else "non-streamed") for stream in streams]
        if replay and replay.levels:  # OpenEnv answers every stream by replay too: like for like
            variants.append((replay, True, "streamed by replay"))
        for proxy, stream, how in variants:
            mine = [lv for lv in proxy.levels if lv.stream == stream]
            if peer and peer.levels:
                pairs = [(a, b) for a in mine if (b := _level(peer, a.agents, stream))]
                ratios = [(a.agents, r) for a, b in pairs if (r := cpu_ratio(a, b)) is not None]
                worst = max((r for _, r in ratios), default=float("nan"))
                each = " / ".join(f"{r:.2f}x" for _, r in ratios)
                lines.append(f"{prompt_ids} ids, {how}: CPU/req vs OpenEnv {each} at "
                             f"{' / '.join(str(n) for n, _ in ratios)} agents (target <= 0.33): "
                             f"{'yes' if worst <= 1 / 3 else 'NO'}")  # fmt: skip
                # The relay streams: it is no floor under a replay, which reads one whole reply.
                floor = relay if proxy.name != "harbor-rl-replay" else None
                above = [
                    r
                    for a, b in pairs
                    if (f := _level(floor, a.agents, stream)) and (r := cpu_ratio(a, b, f)) is not None
                ]
                if above:
                    lines.append(f"{prompt_ids} ids, {how}: CPU/req above the bare relay's vs OpenEnv's above it: "
                                 f"at most {max(above):.2f}x (no target; the relay is the floor under any capture)")  # fmt: skip
            if (a := _level(proxy, 64, stream)) and (d := _level(direct, 64, stream)):
                ratio = (a.requests / a.wall_s) / (d.requests / d.wall_s)
                lines.append(f"{prompt_ids} ids, {how}, 64 agents: {ratio:.2f}x direct's req/s (target >= 0.90): "
                             f"{'yes' if ratio >= 0.9 else 'NO'}")  # fmt: skip
            if prompt_ids == 16_384 and (a := _level(proxy, 1, stream)) and (d := _level(direct, 1, stream)):
                added = pct(a.latencies, 0.99) - pct(d.latencies, 0.99)
                lines.append(f"16384 ids, {how}, 1 agent: added p99 {added:+.2f} ms (target <= 10): "
                             f"{'yes' if added <= 10 else 'NO'}")  # fmt: skip
        if prompt_ids == 16_384 and ours.store.get("turns"):
            per_token = ours.store["bytes"] / ours.store["tokens"]
            lines.append(f"16384 ids: store {per_token:.2f} bytes/token (target <= 1.5): "
                         f"{'yes' if per_token <= 1.5 else 'NO'}")  # fmt: skip
    return lines


# -- the report -----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="Capture proxy vs peers: same engine imitation, agents running sessions of 32 turns")
    for col in ("stream", "agents", "target", "req/s", "vs direct", "p50 ms", "p99 ms", "added p50 ms",
                "CPU ms/req", "CPU vs harbor-rl", "failed", "note"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("target", "note") else "right")
    by_name = {o.name: o for o in outcomes}
    direct = {(lv.stream, lv.agents): lv for lv in by_name["direct"].levels} if "direct" in by_name else {}
    ours = (
        {(lv.stream, lv.agents): lv for lv in by_name["harbor-rl"].levels} if "harbor-rl" in by_name else {}
    )
    keys = sorted({(lv.stream, lv.agents) for o in outcomes for lv in o.levels})
    for stream, agents in keys:
        for o in outcomes:
            lv = next((x for x in o.levels if (x.stream, x.agents) == (stream, agents)), None)
            if lv is None or not lv.requests:
                continue
            rate, p50 = lv.requests / lv.wall_s, pct(lv.latencies, 0.5)
            d = direct.get((stream, agents))
            d_rate = d.requests / d.wall_s if d and d.requests else None
            d_p50 = pct(d.latencies, 0.5) if d and d.requests else None
            mine = ours.get((stream, agents))
            cpu_vs = ""
            if lv.cpu_ms is not None and mine is not None and mine.cpu_ms:
                cpu_vs = f"{lv.cpu_ms / mine.cpu_ms:.2f}x"
            table.add_row(
                "yes" if stream else "no", str(agents), o.name, f"{rate:.0f}",
                f"{rate / d_rate:.2f}x" if d_rate else "", f"{p50:.2f}", f"{pct(lv.latencies, 0.99):.2f}",
                f"{p50 - d_p50:+.2f}" if d_p50 is not None and o.name != "direct" else "",
                f"{lv.cpu_ms:.2f}" if lv.cpu_ms is not None else "-", cpu_vs, str(lv.failed),
                (lv.first_failure[:80] if lv.failed else ""),
            )  # fmt: skip
    for o in outcomes:
        if not o.levels:
            table.add_row("-", "-", o.name, "-", "", "", "", "", "-", "", "", o.note[:160] or "no result")
    return table


def long_tables(outcomes: list[Outcome], turns: int) -> tuple[Table, Table]:
    per = Table(title=f"One session of {turns} turns (sequential, non-streamed): per tenth")
    for col in ("target", "tenth", "median ms/turn", "proxy CPU ms/turn"):
        per.add_column(col, justify="left" if col == "target" else "right")
    summary = Table(title=f"One session of {turns} turns: does a turn's cost grow with the session?")
    for col in ("target", "first tenth ms/turn", "last tenth ms/turn", "last/first", "first tenth CPU ms",
                "last tenth CPU ms", "CPU last/first", "turns captured", "note"):  # fmt: skip
        summary.add_column(col, justify="left" if col in ("target", "note") else "right")
    for o in outcomes:
        if not o.tenths:
            summary.add_row(o.name, "-", "-", "", "-", "-", "", "", o.note[:160] or "no result")
            continue
        for i, (ms, cpu) in enumerate(o.tenths, 1):
            per.add_row(o.name, str(i), f"{ms:.2f}", f"{cpu:.2f}" if cpu is not None else "-")
        (f_ms, f_cpu), (l_ms, l_cpu) = o.tenths[0], o.tenths[-1]
        cpu_ratio = f"{l_cpu / f_cpu:.2f}" if f_cpu and l_cpu is not None else ""
        summary.add_row(
            o.name, f"{f_ms:.2f}", f"{l_ms:.2f}", f"{l_ms / f_ms:.2f}", f"{f_cpu:.2f}" if f_cpu is not None else "-",
            f"{l_cpu:.2f}" if l_cpu is not None else "-", cpu_ratio,
            "-" if o.captured is None else str(o.captured), "",
        )  # fmt: skip
    return per, summary


def versions_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="Targets")
    for col in ("target", "version", "status"):
        table.add_column(col)
    for o in outcomes:
        table.add_row(o.name, o.version or "-", o.note or "measured")
    return table


def verdict(outcomes: list[Outcome]) -> list[str]:
    """Our proxy against each measured peer: CPU per request (all levels) and req/s at 64 agents."""
    by_name = {o.name: o for o in outcomes if o.levels}
    ours = by_name.get("harbor-rl")
    if ours is None:
        return ["harbor-rl was not measured"]
    lines = []
    for peer in ("openenv", "litellm"):
        theirs = by_name.get(peer)
        if theirs is None:
            lines.append(f"{peer}: not measured")
            continue
        pairs = [
            (a, b) for a in ours.levels for b in theirs.levels if (a.stream, a.agents) == (b.stream, b.agents)
        ]
        cpu_ahead = all(
            a.cpu_ms is not None and b.cpu_ms is not None and a.cpu_ms < b.cpu_ms for a, b in pairs
        )
        at64 = [(a, b) for a, b in pairs if a.agents == 64]
        rate_ahead = all(a.requests / a.wall_s > b.requests / b.wall_s for a, b in at64 if b.requests)
        rate_verdict = "not measured" if not at64 else "yes" if rate_ahead else "NO"
        lines.append(
            f"harbor-rl vs {peer}: less CPU per request at every level: {'yes' if cpu_ahead else 'NO'}; "
            f"more req/s at 64 agents (streamed and not): {rate_verdict}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"fewer sessions and calls a level, one round, a long session of {QUICK_LONG_TURNS} turns "
        "(a check that it runs, ~2 min without LiteLLM)",
    )
    parser.add_argument(
        "--load", choices=LOADS, default="agent",
        help="the prompt-size runs' load: agent (default: tools, tool-call history, streamed and not) or "
        "plain (the rows before 2026-12-06: text history, ids asked for by the agents, non-streamed)",
    )  # fmt: skip
    parser.add_argument(
        "--targets", nargs="+", default=[*TARGETS, "relay", "harbor-rl-replay"],
        choices=(*TARGETS, "relay", "harbor-rl-replay"),
        help="relay: a bare uvicorn relay, the floor under any capture; harbor-rl-replay: our proxy with "
        "--stream-mode replay, streamed levels (prompt-size runs only, both)",
    )  # fmt: skip
    parser.add_argument(
        "--size-rounds", type=int, default=None,
        help="rounds of each prompt-size level, the targets taking turns (3; 1 with --quick)",
    )  # fmt: skip
    parser.add_argument("--no-install", action="store_true", help="do not create the peers' venvs")
    parser.add_argument(
        "--long-turns", type=int, default=None, help=f"turns of the long session ({LONG_SESSION_TURNS})"
    )
    parser.add_argument("--agents", type=int, nargs="+", help="concurrency levels (default 1 16 64)")
    parser.add_argument(
        "--prompt-sizes-only", action="store_true", help="only the 512 / 16,384 prompt-id runs"
    )
    parser.add_argument(
        "--serve-harbor", nargs=4, metavar=("PORT", "UPSTREAM", "STORE", "MODE"), help=argparse.SUPPRESS
    )
    parser.add_argument("--serve-relay", nargs=2, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size_rounds is not None and args.size_rounds < 1:
        parser.error(f"--size-rounds must be at least 1, got {args.size_rounds}")
    if args.serve_harbor:
        port, upstream, store, mode = args.serve_harbor
        serve_harbor(int(port), upstream, store, mode)
        return
    if args.serve_relay:
        serve_relay(int(args.serve_relay[0]), args.serve_relay[1])
        return

    cores = sorted(os.sched_getaffinity(0))
    proxy_core, engine_core = (cores[0], cores[-1]) if len(cores) >= 2 else (None, None)
    if engine_core is not None:
        os.sched_setaffinity(0, {engine_core})  # the load generator shares the engine's core
    long_turns = args.long_turns or (QUICK_LONG_TURNS if args.quick else LONG_SESSION_TURNS)
    logdir = Path(tempfile.mkdtemp(prefix="harbor-bench-peers-"))
    pinning = (
        f"proxies pinned to core {proxy_core}, engine and agents to core {engine_core}"
        if proxy_core is not None
        else "nothing pinned (one core)"
    )
    rounds = args.size_rounds or (1 if args.quick else SIZE_ROUNDS)
    sizes = run_sizes(
        args.targets, proxy_core, engine_core, not args.no_install, logdir, rounds, args.load, args.quick
    )
    console.print(size_table(sizes, args.load))
    console.print(store_table(sizes, args.load))
    for line in size_verdict(sizes, args.load):
        console.print(line)
    if args.prompt_sizes_only:
        console.print(f"{pinning}; logs in {logdir}")
        return
    engine_port = free_port()
    engine = start_engine(engine_port, engine_core, logdir)
    try:
        engine_url = f"http://127.0.0.1:{engine_port}"
        outcomes = [
            run_target(
                name, engine_url, proxy_core, args.quick, not args.no_install, long_turns, logdir, args.agents
            )
            for name in args.targets
            if name in TARGETS
        ]
    finally:
        peers.stop(engine)
    console.print(versions_table(outcomes))
    console.print(main_table(outcomes))
    per, summary = long_tables(outcomes, long_turns)
    console.print(summary)
    console.print(per)
    console.print(f"{pinning}; logs in {logdir}")
    for line in verdict(outcomes):
        console.print(line)
    if any(o.note.startswith("failed") for o in outcomes if o.name in ("direct", "harbor-rl")):
        sys.exit(1)


if __name__ == "__main__":
    main()
