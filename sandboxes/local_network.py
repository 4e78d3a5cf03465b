"""The local sandbox's network: its own namespace, in which only the capture proxy is reachable.

bubblewrap's `--unshare-net` gives each exec a network namespace holding nothing but a loopback
interface, so model-written commands reach no port of the host (the engine's weight routes, the trainer
API, PostgreSQL). The capture proxy is put back at the address the harness is given,
`127.0.0.1:<proxy port>`, over a Unix socket:

    agent ──TCP 127.0.0.1:P──► socat (inside the namespace) ──/run/harbor-net/proxy.sock──►
        ProxyForwarder (this process, asyncio) ──TCP 127.0.0.1:P──► capture proxy

Nothing else crosses: the socket only ever connects to the proxy's port. This is the layout Anthropic's
sandbox-runtime uses for Claude Code on Linux (bwrap `--unshare-net`, socat bridging to Unix sockets a
host process owns). The forwarder starts with the sandbox and stops with it; socat runs inside each
exec's namespace and dies with it (bwrap's pid namespace ends when the command does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

NAMESPACE_DIR = "/run/harbor-net"
"""Where the forwarder's socket folder is bound (read-only) inside the sandbox."""
SOCKET_NAME = "proxy.sock"
_CHUNK = 65536

# Run inside the namespace before the command: start socat, wait until it listens (so the command's
# first call never races it), then become the command. $1 port, $2 socket, the rest the command.
# setpriv (util-linux) gives socat a parent-death signal: the shell execs into the command, so socat
# dies with the command however it ends, even where the namespace itself outlives it.
_LAUNCHER = r"""
setpriv --pdeathsig KILL socat "TCP-LISTEN:$1,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$2" \
  </dev/null >/dev/null 2>&1 &
want=$(printf ':%04X 00000000:0000 0A' "$1")
i=0
until grep -q "$want" /proc/net/tcp; do
  i=$((i + 1))
  if [ "$i" -gt 1000 ]; then echo "harbor-rl: the proxy forwarder (socat) did not start" >&2; exit 125; fi
  sleep 0.01
done
shift 2
exec "$@"
"""


def socat_path() -> str | None:
    """The socat the namespace side needs (Debian package `socat`), or None."""
    return shutil.which("socat")


def launcher_argv(port: int, argv: list[str]) -> list[str]:
    """`argv` wrapped so it runs with the capture proxy listening on 127.0.0.1:`port` in its namespace."""
    return ["/bin/sh", "-c", _LAUNCHER, "harbor-net", str(port), f"{NAMESPACE_DIR}/{SOCKET_NAME}", *argv]


class ProxyForwarder:
    """The host side: a Unix socket whose every connection is relayed to 127.0.0.1:`port` (the proxy).

    The socket lives in its own short temporary folder (a Unix socket path is limited to 108 bytes, and
    rollout folders can be deeper than that); the sandbox binds the folder read-only, so the agent can
    connect to the socket but neither remove nor replace it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.folder: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._relays: set[asyncio.Task] = set()

    async def start(self) -> Path:
        """Create the folder and listen; returns the folder to bind into the sandbox."""
        self.folder = Path(tempfile.mkdtemp(prefix="harbor-net-"))
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.folder / SOCKET_NAME))
        return self.folder

    async def stop(self) -> None:
        """Stop listening, cut the relays in flight and remove the folder. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._relays):
            task.cancel()
        if self._relays:
            await asyncio.gather(*self._relays, return_exceptions=True)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._relays.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError as exc:  # the proxy is down: the agent sees a refused connection, as it would
                log.warning("local sandbox: cannot reach the capture proxy on port %d: %s", self.port, exc)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                _close(up_writer)
        except asyncio.CancelledError:
            # stop() cut this relay. The task ends normally: asyncio's stream server asks a handler task
            # for its exception when it ends, and on Python 3.11 a cancelled one logs a traceback there.
            pass
        finally:
            _close(writer)
            if task is not None:
                self._relays.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then pass the half-close on (HTTP keep-alive and SSE need both ways)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        writer.close()
