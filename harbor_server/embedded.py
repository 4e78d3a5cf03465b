"""`harbor serve` inside this process, on a background thread: how `harbor train`, `harbor eval` and
`harbor collect` start their server, and what tests, benchmarks and notebooks use.

    with running_server(ServeConfig(datasets=["builtin"], port=free_port(), capture_port=free_port(),
                                    llm_url=url, model="tiny", store_url="sqlite:///tmp/t.db")) as server:
        factory = HarborSessionFactory(server.url, split="builtin", harness="oracle", ...)

It is the real server (two uvicorn servers on one private event loop), not an imitation.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from harbor_server.config import ServeConfig
from harbor_server.server import HarborServer


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """HarborServer.serve() on a private event loop in a daemon thread."""

    def __init__(self, server: HarborServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="harbor-serve")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.config.port}"

    @property
    def capture_url(self) -> str:
        return f"http://127.0.0.1:{self.server.config.capture_port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        except BaseException as exc:  # handed to whoever waits in start()
            self.error = exc
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        """Cancel what is still scheduled (a mounted Gradio app's queue loops) and close, as
        `asyncio.run` does, so no task is destroyed while pending."""
        leftover = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in leftover:
            task.cancel()
        with contextlib.suppress(BaseException):
            self.loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def start(self, timeout_s: float = 180.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"harbor server did not start: {self.error}") from self.error
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            time.sleep(0.05)
        raise TimeoutError("harbor server did not answer /health in time")

    def run(self, coro: Any, timeout_s: float = 60.0) -> Any:
        """Run `coro` on the server's loop (to reach in-process state) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Shut down as on SIGTERM: live rollouts are cancelled, their sandboxes stopped."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.server.request_shutdown)
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError("harbor server did not stop")


@contextlib.contextmanager
def running_server(config: ServeConfig, **kwargs: Any) -> Iterator[ServerThread]:
    """Start a HarborServer for `config` (kwargs go to HarborServer), yield it, stop it."""
    thread = ServerThread(HarborServer(config, **kwargs)).start()
    try:
        yield thread
    finally:
        thread.stop()
