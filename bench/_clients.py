"""HTTP clients for a benchmark's simulated agents: one each, as each real agent is a process with its
own connection.

One httpx client shared by 64 agents measures its own pool instead: httpcore 1.0.9's
`AsyncConnectionPool._assign_requests_to_connections` checks every connection against every idle one
(a socket poll each) whenever a request starts or ends. In bench/proxy_peers.py at 64 agents and
16,384 prompt ids that was 39% of the load generator's samples through our proxy (19% direct), on the
engine's core, and every proxy, the bare relay too, read 0.5-0.7x of direct's req/s there (1.0-1.2x
with a client per agent; py-spy, 2026-12-06).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx


@asynccontextmanager
async def agent_clients(agents: int, timeout_s: float) -> AsyncIterator[list[httpx.AsyncClient]]:
    """`agents` clients, made before the caller starts its clock, all closed on the way out."""
    clients = [httpx.AsyncClient(timeout=timeout_s) for _ in range(agents)]
    try:
        yield clients
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))
