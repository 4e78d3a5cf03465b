"""The server's listening sockets, bound before it touches anything else.

A second `harbor serve` on a port in use used to find out only when uvicorn tried to bind, after it
had swept the store and set up sandbox networks (and then died with uvicorn's `SystemExit: 3`). Bound
and listening first, handed to uvicorn afterwards (`Server.serve(sockets=...)`), the check has no race:
the port is ours from that moment on.
"""

from __future__ import annotations

import contextlib
import errno
import socket

from harbor_server.errors import PortInUse, StartRefused

BACKLOG = 2048
"""As the uvicorn servers are configured (bursts of rollout requests)."""


def bind_listener(host: str, port: int, *, flag: str, what: str) -> socket.socket:
    """A TCP socket listening on host:port, as uvicorn's `Config.bind_socket` makes it (IPv6 when the
    host is an IPv6 address, SO_REUSEADDR); PortInUse naming `flag` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # Lets a restarted server bind while the old one's connections sit in TIME_WAIT; on Linux it
        # never lets two sockets listen on one port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)  # at once: a bound socket that does not listen yet does not hold the port
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"{what} port {port} on {host} is in use by another process (another harbor serve?)",
                flag=flag,
            ) from None
        raise StartRefused(
            f"cannot listen on {host}:{port} ({what} port): {exc.strerror or exc}", flag=flag
        ) from None
    return sock


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
