"""The local sandbox's network: the capture proxy always, the internet when the task allows it, the
host never.

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

A task with internet (`public`) or an allow-list gets a `PublicNamespace`: one network namespace per
sandbox, made by this (host) side, given user-mode networking by slirp4netns with
`--disable-host-loopback`, and an nftables filter on its output that rejects the host's own addresses,
its LANs and every private, link-local, loopback and reserved range (`firewall.BLOCKED_RANGES`, the
ranges the docker backend rejects), DNS to slirp's forwarder excepted. Each exec joins it with
`nsenter --net` before bwrap (`--share-net`); the capture proxy is at 127.0.0.1:<port> there too,
through one socat per namespace and the same Unix socket. The namespace, the filter and socat belong
to the host's side (the initial user namespace as root, else a user namespace of the host user's
own), so root inside the sandbox (bwrap's own, nested user namespace) has no capability over them: it
can neither flush the filter nor change a route.

    agent ──► tap0 10.0.2.100 ──► slirp4netns (host process, connect() from the host) ──► internet
                 └─ nft output filter: host addresses, LANs, private ranges ─► REJECT

Chosen by measurement (2026-12-07, 2 cores, Debian bookworm packages; host side inside a test-made
namespace, the "internet" a python http.server behind a veth; `bench`-style shell probes):

    tool                     ready    download  host 127.0.0.1  gateway->host lo  host's LAN IP
    slirp4netns 1.2.0        13 ms    588 MB/s  refused         refused           OPEN without the filter
    pasta (passt 2023-03-09) 82 ms    183 MB/s  refused         refused (-T none  its own (pasta copies
                                                                 --no-map-gw)      it); other host IPs
                                                                                   unfiltered (connect())
    (the host's own namespace, for scale: 1022 MB/s)

Bookworm's pasta also refuses to run as root without `--runas`, and spun a core at 100% when it could
not map users; slirp4netns starts 6x faster and moves 3x the bytes. Neither filters by destination
beyond the host's loopback, hence the nft filter. Measured through `LocalSandbox` (5 sandboxes x 10
execs of `true`, 2 busy cores): making the namespace (holder, slirp4netns, nft, socat) takes 70-110 ms
once per sandbox, at its first exec that needs it; an exec in it takes 31 ms (median), against 70-84 ms
for a no-network exec, which starts a socat and a namespace of its own each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sandboxes import firewall
from sandboxes.errors import SandboxUnavailable

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


# -- internet without the host: one namespace per sandbox, slirp4netns and an nftables filter ------------

SLIRP_DNS = "10.0.2.3"
"""slirp4netns's DNS forwarder (it asks the host's resolvers); the only 10.0.2.0/24 address allowed."""
TAP = "tap0"
_READY_TIMEOUT_S = 10.0
_PUBLIC_TOOLS = ("slirp4netns", "nft", "nsenter", "unshare", "setpriv", "socat")
_TOOL_PACKAGES = {"slirp4netns": "slirp4netns", "nft": "nftables", "socat": "socat"}


def public_network_problem() -> str | None:
    """Why a local sandbox cannot have internet without the host here (a missing tool), or None."""
    missing = [tool for tool in _PUBLIC_TOOLS if shutil.which(tool) is None]
    if not missing:
        return None
    packages = sorted({_TOOL_PACKAGES.get(tool, "util-linux") for tool in missing})
    return (
        f"{', '.join(missing)} not installed (apt-get install {' '.join(packages)}, or bash scripts/setup.sh)"
    )


def host_addresses() -> list[str]:
    """Every IPv4 address of this (the host's) network namespace: a public sandbox reaches none of them."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False)
    found: list[str] = []
    for line in done.stdout.splitlines():
        words = line.split()
        if "inet" in words:
            address = words[words.index("inet") + 1].split("/")[0]
            if address not in found:
                found.append(address)
    return found


def filter_rules(blocked: list[str], allowed: list[str] | None) -> str:
    """The nftables ruleset of a public (`allowed` None) or allow-listed namespace, as `nft -f` reads it.

    Output only: nothing from outside can open a connection in (slirp4netns forwards no port). Loopback
    (the proxy's socat, the sandbox's own servers) is always allowed. A public namespace may reach
    slirp's DNS, then everything but `blocked` (the host's addresses, LANs, private ranges). An
    allow-listed one reaches `allowed` only (names are pinned in /etc/hosts: no DNS), host addresses
    included when the list names them, as in the docker backend. IPv6 is rejected (slirp4netns runs
    without it). REJECT, not DROP: an agent fails fast instead of hanging."""
    collapsed = [str(n) for n in ipaddress.collapse_addresses(ipaddress.ip_network(b) for b in blocked)]
    lines = [
        "table inet harbor_rl",
        "delete table inet harbor_rl",  # the two lines replace the table atomically (one transaction)
        "table inet harbor_rl {",
        "  chain out {",
        "    type filter hook output priority 0; policy accept;",
        '    oif "lo" accept',
        "    meta nfproto ipv6 reject",
    ]
    if allowed is None:
        lines += [f"    ip daddr {SLIRP_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept"]
        lines += [f"    ip daddr {{ {', '.join(collapsed)} }} reject", "    accept"]
    else:
        nets = [str(n) for n in ipaddress.collapse_addresses(ipaddress.ip_network(a) for a in allowed)]
        if nets:
            lines += [f"    ip daddr {{ {', '.join(nets)} }} accept"]
        lines += ["    reject"]
    lines += ["  }", "}", ""]
    return "\n".join(lines)


class PublicNamespace:
    """A sandbox's own network namespace with internet through slirp4netns, the host filtered out.

    Made by this process: a holder (`unshare --net sleep`), slirp4netns attached to it, the filter,
    and socat listening for the capture proxy. Each of them dies with this process (parent-death
    signal, slirp's exit pipe) even when `stop` never runs; `stop` ends them at once."""

    def __init__(self, folder: Path, proxy_socket: Path | None, proxy_port: int | None) -> None:
        self.folder = folder
        """Where its resolv.conf and hosts files are (bound into the sandbox read-only)."""
        self.proxy_socket = proxy_socket
        self.proxy_port = proxy_port
        self._holder: asyncio.subprocess.Process | None = None
        self._slirp: asyncio.subprocess.Process | None = None
        self._socat: asyncio.subprocess.Process | None = None
        self._exit_w: int | None = None
        self.userns = os.geteuid() != 0
        """Without root the namespace needs a user namespace of our own, which each exec joins too."""

    @property
    def pid(self) -> int:
        assert self._holder is not None, "the namespace is not started"
        return self._holder.pid

    def enter_argv(self) -> list[str]:
        """The prefix that runs a command in this namespace (then bwrap with --share-net)."""
        if self.userns:
            return ["nsenter", f"--target={self.pid}", "--user", "--net", "--preserve-credentials", "--"]
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--"]

    @property
    def resolv_conf(self) -> Path:
        return self.folder / "resolv.conf"

    @property
    def hosts_file(self) -> Path:
        return self.folder / "hosts"

    async def start(self, allowed: list[str] | None = None, pins: dict[str, str] | None = None) -> None:
        """Make the namespace, give it slirp4netns, filter it (see `apply`), start the proxy's socat."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.resolv_conf.write_text(f"nameserver {SLIRP_DNS}\n")
        self.hosts_file.write_text(_hosts_text({}))
        unshare = ["unshare", "--user", "--map-root-user", "--net"] if self.userns else ["unshare", "--net"]
        self._holder = await asyncio.create_subprocess_exec(
            "setpriv", "--pdeathsig", "KILL", *unshare, "sleep", "infinity",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await self._wait_for_namespace()
        await self._start_slirp()
        await self.apply(allowed, pins)
        if self.proxy_port is not None and self.proxy_socket is not None:
            await self._start_socat()

    async def apply(self, allowed: list[str] | None, pins: dict[str, str] | None = None) -> None:
        """Filter the namespace: public (`allowed` None) or only `allowed` addresses; pins go to hosts."""
        blocked = list(firewall.BLOCKED_RANGES) + await asyncio.to_thread(_host_blocks)
        rules = filter_rules(blocked, allowed)
        await self._run_inside(["nft", "-f", "-"], rules, "install the network filter (nft)")
        self.hosts_file.write_text(_hosts_text(pins or {}))

    async def stop(self) -> None:
        """End socat, slirp4netns and the holder (the namespace goes with the last of them). Idempotent."""
        if self._exit_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._exit_w)  # slirp4netns exits when its exit pipe closes
            self._exit_w = None
        for proc in (self._socat, self._slirp, self._holder):
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self._socat = self._slirp = self._holder = None

    # -- internals ------------------------------------------------------------------------------

    async def _wait_for_namespace(self) -> None:
        """Until the holder is in its own network namespace (unshare has run)."""
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._holder.returncode is not None:
                err = (await self._holder.stderr.read()).decode(errors="replace").strip()
                raise SandboxUnavailable(
                    f"local sandbox network: unshare failed: {err or self._holder.returncode}"
                )
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{self.pid}/ns/net") != mine:
                    return
            await asyncio.sleep(0.002)
        raise SandboxUnavailable("local sandbox network: the namespace holder did not start in 10 s")

    async def _start_slirp(self) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, self._exit_w = os.pipe()
        os.set_inheritable(ready_w, True)
        os.set_inheritable(exit_r, True)
        userns = [f"--userns-path=/proc/{self.pid}/ns/user"] if self.userns else []
        try:
            self._slirp = await asyncio.create_subprocess_exec(
                "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", *userns, str(self.pid), TAP,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, pass_fds=(ready_w, exit_r),
            )  # fmt: skip
        finally:
            os.close(ready_w)
            os.close(exit_r)
        try:
            got = await asyncio.wait_for(asyncio.to_thread(os.read, ready_r, 1), _READY_TIMEOUT_S)
        except TimeoutError:
            got = b""
        finally:
            os.close(ready_r)
        if got != b"1":
            if self._slirp.returncode is None:
                self._slirp.kill()
            err = (await self._slirp.stderr.read()).decode(errors="replace").strip()
            raise SandboxUnavailable(f"local sandbox network: slirp4netns did not start: {err[-500:]}")

    async def _start_socat(self) -> None:
        listen = f"TCP-LISTEN:{self.proxy_port},bind=127.0.0.1,fork,reuseaddr"
        self._socat = await asyncio.create_subprocess_exec(
            "setpriv", "--pdeathsig", "KILL", *self.enter_argv(),
            "socat", listen, f"UNIX-CONNECT:{self.proxy_socket}",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        want = f":{self.proxy_port:04X} 00000000:0000 0A"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._socat.returncode is not None:
                break
            with contextlib.suppress(OSError):  # the holder's view is the namespace's
                if want in Path(f"/proc/{self.pid}/net/tcp").read_text():
                    return
            await asyncio.sleep(0.002)
        err = b"" if self._socat.returncode is None else await self._socat.stderr.read()
        raise SandboxUnavailable(
            f"local sandbox network: the proxy forwarder (socat) did not start: {err.decode(errors='replace')[-500:]}"
        )

    async def _run_inside(self, argv: list[str], stdin: str, what: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self.enter_argv(), *argv,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(stdin.encode())
        if proc.returncode != 0:
            raise SandboxUnavailable(
                f"local sandbox network: could not {what}: {(err or out).decode(errors='replace').strip()[-500:]}"
            )


def _host_blocks() -> list[str]:
    """The host's own addresses and LANs, read now (a Docker network made since is in 172.16/12)."""
    return host_addresses() + firewall.host_lan_subnets()


def _hosts_text(pins: dict[str, str]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for name, address in pins.items()]
    return "\n".join(lines) + "\n"
