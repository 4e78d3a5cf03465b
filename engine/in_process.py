"""Run an ASGI app (the embedded engine, the vLLM imitation, any app) with uvicorn on a background thread
of this process, and know its URL once it answers: what `harbor train` starts its engine with, and what
tests and benchmarks serve their apps with."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    start_timeout_s: float = 20.0,
    log_level: str = "critical",
) -> Iterator[str]:
    """Serve `app` until the block ends; yields its base URL (no /v1). RuntimeError when it has not
    started within `start_timeout_s` (a model that loads slowly needs more than the default)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-in-process", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on {host}:{port} did not start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
