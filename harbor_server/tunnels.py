"""How remote (E2B) sandboxes reach the capture port: `harbor serve --expose direct|cloudflare|gradio`,
with OpenEnv's meaning (`openenv.core.harness.capture.forwarding`).

    direct      the public URL you give (`--public-url`): a tunnel you run, or this machine's address
    cloudflare  a Cloudflare quick tunnel: `cloudflared tunnel --url http://127.0.0.1:<capture port>`,
                whose https://*.trycloudflare.com URL is read from its log
    gradio      Gradio's share tunnel (frpc to Gradio's share server), opened by gradio's own
                `networking.setup_tunnel`, as `launch(share=True)` does

A tunnel is opened once at start-up, its URL becomes the server's `public_url` (what E2B sandboxes are
given, and what /info reports), and it is stopped with the server. Failing to open one is a
`TunnelError` with one line that says what to do; a server never starts with a URL that leads nowhere.
The URL is public either way: what guards the engine behind it is the capture port's session keys.
"""

from __future__ import annotations

import logging
import queue
import re
import secrets
import shutil
import subprocess
import threading
import time
from typing import IO, Protocol

from harbor_server.errors import TunnelError

log = logging.getLogger(__name__)

EXPOSE_MODES = ("none", "direct", "cloudflare", "gradio")
"""`--expose` values: none (no public URL), direct (the one given), and the two tunnels."""
TUNNELS = ("cloudflare", "gradio")

CLOUDFLARED_INSTALL = (
    "https://developers.cloudflare.com/cloudflare-one/connections/connect-networks/downloads/"
)
_QUICK_TUNNEL_URL = re.compile(r"https://[-a-z0-9]+\.trycloudflare\.com\b")
_CLOUDFLARE_API_HOST = "https://api.trycloudflare.com"
"""Where cloudflared asks for a quick tunnel; its error lines name it, and it is not the tunnel's URL."""
STOP_TIMEOUT_S = 10.0


class Tunnel(Protocol):
    """An open tunnel to the capture port."""

    name: str
    url: str
    """The public base URL (no /v1) sandboxes reach the capture port at."""

    def stop(self) -> None:
        """Close the tunnel and wait for its process to end."""
        ...


def check_available(mode: str) -> None:
    """What opening `mode`'s tunnel needs beyond the network is here (said before datasets load)."""
    if mode == "cloudflare" and shutil.which("cloudflared") is None:
        raise TunnelError(
            f"--expose cloudflare needs the cloudflared binary on PATH: install it ({CLOUDFLARED_INSTALL}), "
            "or use --expose direct --public-url URL"
        )
    if mode == "gradio":
        try:
            import gradio.networking  # noqa: F401
        except ImportError as exc:
            raise TunnelError(
                f"--expose gradio needs gradio ({exc}); or use --expose direct --public-url URL"
            ) from None


def open_tunnel(mode: str, host: str, port: int, *, timeout_s: float = 60.0) -> Tunnel:
    """A tunnel from a public URL to `host:port` (blocking: run it in a thread)."""
    check_available(mode)
    if mode == "cloudflare":
        return CloudflareTunnel.open(host, port, timeout_s=timeout_s)
    if mode == "gradio":
        return GradioTunnel.open(host, port)
    raise ValueError(f"--expose {mode!r} opens no tunnel (tunnels: {', '.join(TUNNELS)})")


class CloudflareTunnel:
    """A Cloudflare quick tunnel (no account). cloudflared logs to stderr, the URL in a banner line
    `INF |  https://word-word-word-word.trycloudflare.com  |` under "Your quick Tunnel has been created!"."""

    name = "cloudflare"

    def __init__(self, proc: subprocess.Popen, url: str, reader: threading.Thread) -> None:
        self.proc = proc
        self.url = url
        self._reader = reader

    @classmethod
    def open(cls, host: str, port: int, *, timeout_s: float) -> CloudflareTunnel:
        command = [
            shutil.which("cloudflared") or "cloudflared",
            "tunnel",
            "--no-autoupdate",
            "--url",
            f"http://{host}:{port}",
        ]
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        lines: queue.Queue[str | None] = queue.Queue()
        found = threading.Event()
        reader = threading.Thread(
            target=_pump, args=(proc.stderr, "cloudflared", lines, found), name="cloudflared-log", daemon=True
        )
        reader.start()
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _terminate(proc)
                raise TunnelError(
                    f"cloudflared printed no trycloudflare.com URL within {timeout_s:.0f} s{_last(seen)}; "
                    "check that it can reach Cloudflare, or use --expose direct --public-url URL"
                ) from None
            if line is None:  # its log ended: the process is gone
                code = _terminate(proc)
                raise TunnelError(
                    f"cloudflared exited (code {code}) before printing a trycloudflare.com URL{_last(seen)}; "
                    "check that it can reach Cloudflare, or use --expose direct --public-url URL"
                )
            seen.append(line)
            match = _QUICK_TUNNEL_URL.search(line.replace(_CLOUDFLARE_API_HOST, ""))
            if match:
                found.set()
                log.info("cloudflare quick tunnel %s -> %s:%d", match.group(0), host, port)
                return cls(proc, match.group(0), reader)

    def stop(self) -> None:
        _terminate(self.proc)
        self._reader.join(timeout=1)


class GradioTunnel:
    """Gradio's share tunnel, opened by gradio's own code: `networking.setup_tunnel` asks Gradio's API
    server for a share server (or takes $GRADIO_SHARE_SERVER_ADDRESS), downloads frpc once, starts it
    and reads its `start proxy success: URL` line; its `tunneling.Tunnel` holds the frpc process."""

    name = "gradio"

    def __init__(self, tunnel, url: str, readers: list[threading.Thread]) -> None:
        self.tunnel = tunnel
        self.url = url
        self._readers = readers

    @classmethod
    def open(cls, host: str, port: int) -> GradioTunnel:
        from urllib.parse import urlparse, urlunparse

        from gradio import networking, tunneling

        share_token = secrets.token_urlsafe(32)  # as gradio's Blocks makes one
        try:
            address = networking.setup_tunnel(
                local_host=host,
                local_port=port,
                share_token=share_token,
                share_server_address=None,
                share_server_tls_certificate=None,
            )
        except Exception as exc:  # gradio's own: RuntimeError, ValueError, httpx's, OSError
            _forget_gradio_tunnel(share_token)
            raise TunnelError(_gradio_failure(exc)) from None
        tunnel = next(t for t in tunneling.CURRENT_TUNNELS if t.share_token == share_token)
        # https, as launch(share=True) makes it when no share server address is passed to it.
        url = urlunparse(("https", *urlparse(address)[1:])).rstrip("/")
        # gradio reads frpc's stdout only until the URL and never its stderr: drain both, or a full
        # pipe stalls frpc.
        readers = [
            threading.Thread(target=_pump, args=(pipe, "frpc"), name="frpc-log", daemon=True)
            for pipe in (tunnel.proc.stdout, tunnel.proc.stderr)
            if pipe is not None
        ]
        for reader in readers:
            reader.start()
        log.info("gradio share tunnel %s -> %s:%d", url, host, port)
        return cls(tunnel, url, readers)

    def stop(self) -> None:
        from gradio import tunneling

        proc, self.tunnel.proc = self.tunnel.proc, None  # gradio's atexit kill() then has nothing to do
        if self.tunnel in tunneling.CURRENT_TUNNELS:
            tunneling.CURRENT_TUNNELS.remove(self.tunnel)
        if proc is not None:
            _terminate(proc)
        for reader in self._readers:
            reader.join(timeout=1)


def _forget_gradio_tunnel(share_token: str) -> None:
    """A tunnel that failed to give a URL may have left frpc running: stop it."""
    from gradio import tunneling

    for tunnel in [t for t in tunneling.CURRENT_TUNNELS if t.share_token == share_token]:
        tunneling.CURRENT_TUNNELS.remove(tunnel)
        proc, tunnel.proc = tunnel.proc, None
        if proc is not None:
            _terminate(proc)


def _gradio_failure(exc: BaseException) -> str:
    reason = _one_line(exc)
    if exc.__cause__ is not None:
        reason = f"{reason.rstrip('.')}: {_one_line(exc.__cause__)}"
    return (
        f"--expose gradio could not open Gradio's share tunnel ({reason}); it needs api.gradio.app (or "
        "$GRADIO_SHARE_SERVER_ADDRESS), and cdn-media.huggingface.co once for frpc; offline use --expose "
        "direct --public-url URL. (The trace inspector is --inspector now.)"
    )


def _one_line(exc: BaseException) -> str:
    lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text[:300]


def _last(lines: list[str]) -> str:
    """The line that says most about a failure: its last error line, else its last line."""
    errors = [line for line in lines if " ERR " in line or "error" in line.lower()]
    pick = (errors or lines or [""])[-1].strip()
    return f" (it said: {pick[:300]})" if pick else ""


def _pump(
    stream: IO | None,
    name: str,
    lines: queue.Queue[str | None] | None = None,
    found: threading.Event | None = None,
) -> None:
    """Read a tunnel process's log to its end: into `lines` until `found` is set, then to our debug log
    (a pipe nobody reads fills up and stalls the process)."""
    if stream is None:
        return
    try:
        for raw in stream:
            line = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw).rstrip()
            if lines is not None and (found is None or not found.is_set()):
                lines.put(line)
            elif line:
                log.debug("%s: %s", name, line[:1000])
    except (OSError, ValueError):
        pass  # the pipe was closed at stop
    finally:
        if lines is not None:
            lines.put(None)


def _terminate(proc: subprocess.Popen) -> int | None:
    """Stop a tunnel process (SIGTERM, then SIGKILL) and reap it; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
    return proc.returncode
