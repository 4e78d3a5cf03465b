"""The `docker` backend: one container per rollout on a real Docker engine (Docker SDK, in threads).

Containers are labelled (`harbor-rl.sandbox=1`, `harbor-rl.owner=<pid>@<host>`), limited (CPU, memory
without swap, pids), kept alive by `sleep infinity` under docker-init (the image's ENTRYPOINT is kept and
receives it as its command, as Harbor does), and removed on stop; `sweep()` removes the ones whose owning
process is gone. A task with a `docker-compose.yaml` runs under Docker Compose (`sandboxes/compose.py`).

Network: every sandbox sits on a harbor-rl bridge network (one per network mode, inter-container
traffic off; a compose project has bridges of its own), and the firewall (`sandboxes/firewall.py`:
chains hooked from INPUT and DOCKER-USER for interfaces `hrl+`) decides what it reaches:
- the host only at its network's gateway on the capture proxy's port (when the proxy listens on
  127.0.0.1 only, a small TCP forwarder on gateway:port carries the traffic to it);
- `public`: the internet, but no private, carrier-grade-NAT, link-local (cloud metadata), loopback,
  multicast or reserved range, nor the host's own LANs, except the host's DNS resolvers on port 53;
- `allowlist`: only the allowed hosts' addresses (names resolved on the host and pinned into the
  container's /etc/hosts, so it needs no DNS), host addresses included when the list names them;
- `no-network`: nothing but the proxy.
`apply_network` narrows a running sandbox for a phase (the agent's, the verifier's) with rules keyed by
its IP and named after it, replaced on each call and removed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import os
import posixpath
import shlex
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxes import firewall
from sandboxes.base import ExecResult, NetworkMode, SandboxSpec
from sandboxes.errors import SandboxError, SandboxPathError, SandboxUnavailable, UnsupportedEnvironment
from sandboxes.images import ImageBuilder
from sandboxes.policy import Allowlist, check_narrowing, normalize_host, resolve_allowlist

log = logging.getLogger(__name__)

SANDBOX_LABEL = "harbor-rl.sandbox"
OWNER_LABEL = "harbor-rl.owner"
NAME_LABEL = "harbor-rl.name"
NETWORK_LABEL = "harbor-rl.network"
_NETWORKS: dict[str, tuple[str, str]] = {
    # mode: (network name, bridge interface; <= 15 characters, all matching the `hrl+` rules)
    "no-network": ("harbor-rl-nonet", firewall.NONET_BRIDGE),
    "public": ("harbor-rl-public", firewall.PUBLIC_BRIDGE),
    "allowlist": ("harbor-rl-allow", firewall.ALLOW_BRIDGE),
}
_PIDFILE = "/tmp/.harbor-exec-{id}"
# `$$` of this shell is the exec's process-group leader: docker makes every exec a session leader,
# so killing that group on timeout kills everything the command started (unless it left the group).
_WRAPPER = '{ echo $$ >"$0"; } 2>/dev/null; "$@"; rc=$?; rm -f "$0"; exit $rc'


_EXECUTOR: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    """Threads for the blocking SDK. Every running exec holds one while it streams output, so the
    default executor (min(32, cores + 4) threads) would cap concurrent rollouts at a handful."""
    global _EXECUTOR
    if _EXECUTOR is None:
        workers = int(os.environ.get("HARBOR_DOCKER_THREADS", "256"))
        _EXECUTOR = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="harbor-rl-docker")
    return _EXECUTOR


async def _blocking(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


def owner_id() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


@dataclass(frozen=True)
class _Network:
    id: str
    name: str
    bridge: str
    gateway: str
    mode: NetworkMode


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        proxy_upstream_host: str = "127.0.0.1",
        firewall: bool = True,
        max_output_bytes: int = 8 * 1024 * 1024,
        client: Any = None,
    ) -> None:
        """`proxy_upstream_host`: where the capture proxy listens on the host (the forwarder's target).
        `firewall`: install the iptables rules that confine sandboxes (needs root); False trusts the host.
        """
        self.base_url = base_url
        self.proxy_upstream_host = proxy_upstream_host
        self.firewall = firewall
        self.max_output_bytes = max_output_bytes
        self._client = client
        self._builder: ImageBuilder | None = None
        self._setup_lock = threading.Lock()
        self._networks: dict[str, _Network] = {}
        self._quota: bool | None = None
        # (gateway, port) -> (the network it was made for, the listening server)
        self._forwarders: dict[tuple[str, int], tuple[_Network, asyncio.AbstractServer]] = {}
        self._forwarder_lock = asyncio.Lock()

    # -- protocol ---------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.compose_file is not None:
            from sandboxes.compose import start_compose

            return await start_compose(self, spec)
        client = await _blocking(self._connect)
        image = await _blocking(self.builder.image_for, spec)
        if spec.workdir is None:  # the image's own WORKDIR, as Harbor runs it
            spec = spec.model_copy(update={"workdir": await _blocking(_image_workdir, client, image)})
        allowed = (
            await _blocking(resolve_allowlist, spec.allowed_hosts)
            if spec.network_mode == "allowlist"
            else Allowlist()
        )
        for attempt in (1, 2):
            network = await _blocking(self._network_for, spec.network_mode)
            if spec.proxy_port is not None:
                await _blocking(self._allow_proxy_port, network, spec.proxy_port)
                await self._ensure_forwarder(network, spec.proxy_port)
            try:
                container = await _blocking(self._run_container, client, spec, image, network, allowed.pins)
                break
            except _NetworkGone:
                # Another process removed the idle network between our setup and the start: redo it.
                self._networks.pop(spec.network_mode, None)
                if attempt == 2:
                    raise SandboxError(
                        f"network {network.name} keeps disappearing; is another process removing it?"
                    ) from None
        sandbox = DockerSandbox(spec, container, network, backend=self, allowed=allowed)
        try:
            if self.firewall:  # re-check: the rules must be in place while the sandbox runs
                await _blocking(self._ensure_firewall)
                await _blocking(self._claim_ip, sandbox)
            if allowed.addresses:
                await _blocking(
                    self._firewall_call,
                    firewall.allow_addresses,
                    container.name,
                    ["-s", sandbox.ip],
                    allowed.addresses,
                )
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    async def health(self) -> str:
        client = await _blocking(self._connect)
        info = await _blocking(client.info)
        base = (
            "present"
            if await _blocking(self.builder._exists, "harbor-rl/sandbox-base:bookworm")
            else "missing"
        )
        from sandboxes.compose import compose_version

        try:
            compose = f"compose {await _blocking(compose_version)}"
        except SandboxUnavailable:
            compose = "compose MISSING (compose tasks cannot run; scripts/setup.sh installs it)"
        return (
            f"docker: engine {info.get('ServerVersion')}, storage {info.get('Driver')}, "
            f"base image {base}, firewall {'on' if self.firewall else 'OFF'}, {compose}"
        )

    async def sweep(self) -> int:
        """Remove containers and compose projects whose owner process on this host is gone (or that have
        no owner), and firewall rules whose sandbox is gone."""
        return await _blocking(self._sweep)

    async def aclose(self) -> None:
        """Close this backend's proxy forwarders and remove harbor-rl networks no sandbox uses.

        The engine refuses to remove a network with containers attached, so this is safe while other
        processes run sandboxes. The firewall rules stay (they only match harbor-rl bridges); see
        `teardown()`."""
        for _, server in self._forwarders.values():
            server.close()
        for _, server in self._forwarders.values():
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._forwarders.clear()
        if self._client is not None:
            await _blocking(self._remove_idle_networks)

    async def teardown(self) -> bool:
        """`aclose()`, then remove the firewall chains too when no harbor-rl sandbox exists anywhere on
        this engine. Only for when no other harbor-rl process is starting sandboxes (end of a test
        session, `harbor` clean-up): a concurrent start would run unconfined until its next start.
        Returns whether the rules were removed."""
        await self.aclose()
        return await _blocking(self._uninstall_firewall_if_idle)

    # -- docker -----------------------------------------------------------------------------------

    @property
    def builder(self) -> ImageBuilder:
        if self._builder is None:
            self._builder = ImageBuilder(self._connect())
        return self._builder

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        try:
            import docker
        except ImportError as exc:
            raise SandboxUnavailable("the Docker SDK is not installed: pip install docker") from exc
        try:
            # A bigger connection pool: each running exec keeps one connection streaming.
            pool = {"max_pool_size": 64}
            client = (
                docker.DockerClient(base_url=self.base_url, **pool)
                if self.base_url
                else docker.from_env(**pool)
            )
            client.ping()
        except Exception as exc:  # the SDK raises DockerException, requests errors, FileNotFoundError...
            where = self.base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            raise SandboxUnavailable(
                f"cannot reach the Docker engine at {where}: {exc}. Start dockerd (or set DOCKER_HOST), "
                "or use --sandbox local"
            ) from exc
        self._client = client
        return client

    def _run_container(
        self, client: Any, spec: SandboxSpec, image: str, network: _Network, allowed: dict[str, str]
    ):
        name = f"harbor-rl-{_safe_name(spec.name)[:40]}-{uuid.uuid4().hex[:8]}"
        memory = f"{spec.memory_mb}m"
        try:
            return client.containers.run(
                image,
                command=["sleep", "infinity"],
                name=name,
                hostname=_safe_name(spec.name)[:63],
                detach=True,
                init=True,
                labels={SANDBOX_LABEL: "1", OWNER_LABEL: owner_id(), NAME_LABEL: spec.name},
                environment=dict(spec.env),
                working_dir=spec.workdir,
                nano_cpus=int(spec.cpus * 1e9),
                mem_limit=memory,
                memswap_limit=memory,  # no swap: a memory hog meets the OOM killer, not the disk
                pids_limit=spec.pids_limit,
                network=network.name,
                extra_hosts=allowed or None,
                cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT"],
                security_opt=["no-new-privileges"],
                storage_opt={"size": f"{spec.storage_mb}M"} if self._disk_quota(client) else None,
                device_requests=gpu_requests(spec.gpus) or None,
            )
        except Exception as exc:
            # `run` is create + start: a failed start leaves a created container behind.
            with contextlib.suppress(Exception):
                client.containers.get(name).remove(force=True)
            if self._quota and "storage-opt" in str(exc).lower():  # xfs without pquota
                self._quota = False
                return self._run_container(client, spec, image, network, allowed)
            if "network" in str(exc).lower() and "not found" in str(exc).lower():
                raise _NetworkGone(str(exc)) from exc
            if spec.gpus and _is_gpu_refusal(exc):
                raise UnsupportedEnvironment(gpu_refusal(spec, exc)) from exc
            raise SandboxError(f"starting a container from {image} for {spec.name} failed: {exc}") from exc

    def _disk_quota(self, client: Any) -> bool:
        """Whether the engine can cap a container's disk (overlay2 on xfs with pquota only); elsewhere
        `storage_mb` is not enforced and the engine would refuse the option."""
        if self._quota is None:
            info = client.info()
            status = dict(info.get("DriverStatus") or [])
            self._quota = info.get("Driver") == "overlay2" and status.get("Backing Filesystem") == "xfs"
            if not self._quota:
                log.info("docker: storage_mb is not enforced (needs overlay2 on xfs with pquota)")
        return self._quota

    def _sweep(self) -> int:
        from sandboxes.compose import PROJECT_LABEL, sweep_projects

        client = self._connect()
        removed = sweep_projects(self)
        for container in client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}=1"}):
            if PROJECT_LABEL in container.labels or owner_alive(container.labels.get(OWNER_LABEL, "")):
                continue
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
                self._forget_container_rules(container.name)
        if self.firewall:  # rules of sandboxes removed without clean-up (another tool, a crash)
            # Rules first: a sandbox's rules are added after its container (or project network) exists.
            keys = firewall.keys_in_rules()
            alive = {c.name for c in client.containers.list(all=True)}
            alive |= {(n.attrs.get("Labels") or {}).get(PROJECT_LABEL) for n in client.networks.list()}
            if keys - alive:
                with self._setup_lock:
                    firewall.remove_where(lambda comment: firewall.key_of(comment) in keys - alive)
        return removed

    # -- networks and firewall --------------------------------------------------------------------

    def _network_for(self, mode: NetworkMode) -> _Network:
        with self._setup_lock:
            if self.firewall:
                firewall.install()  # idempotent and cheap (iptables -C checks); rules may have been removed
            cached = self._networks.get(mode)
            if cached is not None:
                if self._still_exists(cached):
                    return cached
                # Removed outside harbor-rl (`docker network rm`, an engine that lost its networks):
                # its gateway is gone with it, so make the network again rather than forward to it.
                log.warning("docker: network %s was removed from outside; re-creating it", cached.name)
                del self._networks[mode]
            name, bridge = _NETWORKS[mode]
            network = self._get_or_create_network(name, bridge, masquerade=mode != "no-network")
            config = (network.attrs.get("IPAM") or {}).get("Config") or [{}]
            gateway = config[0].get("Gateway") or _interface_ipv4(bridge)
            if not gateway:
                raise SandboxUnavailable(
                    f"network {name} has no IPv4 gateway; remove it (docker network rm {name})"
                )
            self._networks[mode] = _Network(
                id=network.id, name=name, bridge=bridge, gateway=gateway.split("/")[0], mode=mode
            )
            if self.firewall:  # a recreated network may have a new gateway: drop rules for the old one
                firewall.forget_other_gateways(bridge, self._networks[mode].gateway)
            return self._networks[mode]

    def _still_exists(self, network: _Network) -> bool:
        import docker.errors

        try:
            self._connect().api.inspect_network(network.id)
        except docker.errors.NotFound:
            return False
        return True

    def _get_or_create_network(self, name: str, bridge: str, *, masquerade: bool):
        import docker.errors

        client = self._connect()
        found = client.networks.list(names=[name])
        if found:
            found[0].reload()
            return found[0]
        try:
            network = client.networks.create(
                name,
                driver="bridge",
                labels={NETWORK_LABEL: "1"},
                options={
                    "com.docker.network.bridge.name": bridge,
                    "com.docker.network.bridge.enable_icc": "false",  # rollouts cannot reach each other
                    "com.docker.network.bridge.enable_ip_masquerade": "true" if masquerade else "false",
                },
            )
        except docker.errors.APIError as exc:
            found = client.networks.list(names=[name])  # another process created it first
            if not found:
                raise SandboxUnavailable(f"cannot create the docker network {name}: {exc}") from exc
            network = found[0]
        network.reload()
        return network

    def _ensure_firewall(self) -> None:
        with self._setup_lock:
            firewall.install()

    def _allow_proxy_port(self, network: _Network, port: int) -> None:
        self._firewall_call(firewall.allow_proxy, network.bridge, network.gateway, port)

    def _firewall_call(self, fn: Any, /, *args: Any, **kwargs: Any) -> None:
        """A change to the rules, unless the firewall is off (firewall=False trusts the host)."""
        if self.firewall:
            with self._setup_lock:
                fn(*args, **kwargs)

    def _claim_ip(self, sandbox: DockerSandbox) -> None:
        """Rules another sandbox left on this container's IP (it was removed without clean-up) go:
        the new owner must not inherit its policy."""
        self._firewall_call(firewall.forget_source, sandbox.ip, keep=sandbox.name)

    def _forget_container_rules(self, container_name: str) -> None:
        self._firewall_call(firewall.remove, container_name)

    def _remove_idle_networks(self) -> None:
        import docker.errors

        client = self._connect()
        with self._setup_lock:
            for name, _bridge in _NETWORKS.values():
                for network in client.networks.list(names=[name]):
                    with contextlib.suppress(docker.errors.APIError):  # in use: the engine says no
                        network.remove()
            self._networks.clear()

    def _uninstall_firewall_if_idle(self) -> bool:
        client = self._connect()
        if not self.firewall or client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}=1"}):
            return False
        if any(client.networks.list(names=[name]) for name, _ in _NETWORKS.values()):
            return False
        with self._setup_lock:
            firewall.uninstall()
        return True

    async def _close_forwarders_for(self, network: _Network) -> None:
        """Stop forwarding on a network that is going away (a compose project's)."""
        async with self._forwarder_lock:
            for key, (made_for, server) in list(self._forwarders.items()):
                if made_for.id == network.id:
                    server.close()
                    del self._forwarders[key]

    async def _ensure_forwarder(self, network: _Network, port: int) -> None:
        """Make gateway:port reach the proxy: nothing to do when something already listens there."""
        gateway = network.gateway
        async with self._forwarder_lock:
            for key, (made_for, server) in list(self._forwarders.items()):
                # A forwarder serves only while the loop that made it runs (a backend reused from
                # another loop, e.g. a later test's) and on the network it was made for (one
                # re-created since may have another gateway): close such ones and start afresh.
                stale_network = made_for.name == network.name and made_for.id != network.id
                if stale_network or (
                    key == (gateway, port) and server.get_loop() is not asyncio.get_running_loop()
                ):
                    with contextlib.suppress(Exception):
                        server.close()  # on a closed loop this still closes the listening socket
                    del self._forwarders[key]
            if (gateway, port) in self._forwarders:
                return
            upstream = self.proxy_upstream_host

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                try:
                    up_reader, up_writer = await asyncio.open_connection(upstream, port)
                except OSError:
                    writer.close()
                    return
                await asyncio.gather(
                    _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
                )

            try:
                server = await asyncio.start_server(handle, host=gateway, port=port)
            except OSError as exc:
                if exc.errno == 98:  # EADDRINUSE: the proxy (0.0.0.0) or another forwarder serves it
                    return
                raise SandboxUnavailable(
                    f"cannot forward {gateway}:{port} to the capture proxy: {exc}"
                ) from exc
            self._forwarders[(gateway, port)] = (network, server)


_CANNOT_ENTER = ("OCI runtime exec failed", "cannot exec in a stopped state")
"""What runc answers (exit 126) to an exec into a container that is being removed."""


class _NetworkGone(Exception):
    pass


_PHASE_PIN = "# harbor-rl phase"
# Rewrite /etc/hosts in place (it is a bind mount: renaming over it, as `sed -i` does, fails): drop the
# previous phase's pins, add "$@".
_PIN_SCRIPT = (
    f'{{ grep -v " {_PHASE_PIN}$" /etc/hosts || true; for line in "$@"; do printf "%s\\n" "$line"; done; }} '
    ">/tmp/.harbor-rl-hosts && cat /tmp/.harbor-rl-hosts >/etc/hosts; rc=$?; rm -f /tmp/.harbor-rl-hosts; exit $rc"
)


class DockerSandbox:
    def __init__(
        self,
        spec: SandboxSpec,
        container: Any,
        network: _Network,
        *,
        backend: DockerBackend,
        allowed: Allowlist | None = None,
    ) -> None:
        self.spec = spec
        self.container = container
        self.network = network
        self._backend = backend
        self._api = backend._connect().api
        self._stopped = False
        self.allowed_at_start = allowed or Allowlist()
        """The start allow-list made concrete (its names are pinned in /etc/hosts by the engine)."""
        self._start_policy = _policy_key(spec.network_mode, spec.allowed_hosts)
        self._policy = self._start_policy
        self._phase = 0
        self._phase_pins = False
        self._ip: str | None = None

    @property
    def proxy_host(self) -> str:
        return self.network.gateway

    @property
    def name(self) -> str:
        return self.container.name

    @property
    def ip(self) -> str:
        """The container's address on its network (blocking the first time: call it in a thread)."""
        if self._ip is None:
            self._ip = _container_ip(self.container, self.network.name)
        return self._ip

    # -- network ----------------------------------------------------------------------------------

    async def apply_network(self, mode: NetworkMode, allowed_hosts: list[str]) -> None:
        """Narrow (or restore) what the sandbox reaches: firewall rules keyed by its IP, named after it,
        replaced on each call; allow-listed names pinned into /etc/hosts. The proxy stays reachable."""
        self._check_running()
        check_narrowing(self.spec, mode, allowed_hosts)
        wanted = _policy_key(mode, allowed_hosts)
        if wanted == self._policy:
            return
        allowlist = Allowlist()
        if mode == "allowlist":
            allowlist = await _blocking(resolve_allowlist, allowed_hosts, known=self.allowed_at_start.pins)
        restore = wanted == self._start_policy  # back to the start: the phase rules simply go
        self._phase += 1
        await _blocking(
            self._backend._firewall_call,
            firewall.set_phase,
            self._rules_key(),
            self._rules_match(),
            self._phase,
            allowed=None if restore else allowlist.addresses,
            start_allowed=self.allowed_at_start.addresses,
            outward=self._rules_outward(),
        )
        pins = (
            {}
            if restore
            else {h: a for h, a in allowlist.pins.items() if h not in self.allowed_at_start.pins}
        )
        if pins or self._phase_pins:
            lines = [f"{address}\t{host} {_PHASE_PIN}" for host, address in sorted(pins.items())]
            done = await self.exec(["sh", "-c", _PIN_SCRIPT, "pin", *lines], user="0", timeout_s=60)
            if not done.ok:
                raise SandboxError(
                    f"pinning allowed hosts in {self.name}'s /etc/hosts failed: {done.stderr.strip()}"
                )
            self._phase_pins = bool(pins)
        self._policy = wanted

    def _rules_key(self) -> str:
        return self.name

    def _rules_match(self) -> list[str]:
        return ["-s", self.ip]

    def _rules_outward(self) -> list[str]:
        return []

    # -- exec -------------------------------------------------------------------------------------

    async def exec(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._check_running()
        argv = ["bash", "-lc", command] if isinstance(command, str) else list(command)
        if not argv:
            raise SandboxError("exec needs a non-empty command")
        exec_key = uuid.uuid4().hex[:12]
        pidfile = _PIDFILE.format(id=exec_key)
        started = time.monotonic()
        try:
            exec_id = await _blocking(self._exec_create, argv, pidfile, cwd, env, user)
            stream = await _blocking(self._api.exec_start, exec_id, stream=True, demux=True)
        except Exception as exc:
            if not _is_docker_error(exc):
                raise
            text = str(exc).lower()
            if "no such container" in text or "is not running" in text or "not found" in text:
                # The sandbox itself is gone (crashed, removed): not the command's failure.
                raise SandboxError(f"sandbox {self.spec.name} is not running: {exc}") from exc
            return ExecResult(
                exit_code=126, stderr=f"exec failed: {exc}\n", duration_s=time.monotonic() - started
            )
        buffers = _Capture(self._backend.max_output_bytes)
        reader = asyncio.ensure_future(_blocking(_drain, stream, buffers))
        try:
            timed_out = await self._wait(reader, exec_id, timeout_s)
        except asyncio.CancelledError:
            # The caller gave up (rollout cancelled): do not leave the command running.
            asyncio.get_running_loop().run_in_executor(_executor(), self._kill_exec, exec_id, pidfile)
            stream.close()
            raise
        if timed_out:
            await _blocking(self._kill_exec, exec_id, pidfile)
        done, _ = await asyncio.wait({reader}, timeout=3.0)
        if not done:  # something that left the process group still holds the pipes
            stream.close()
            await asyncio.wait({reader}, timeout=3.0)
        info = await _blocking(self._api.exec_inspect, exec_id)
        exit_code = None if timed_out else info.get("ExitCode")
        stdout, stderr = buffers.text(0), buffers.text(1)
        if exit_code == 126 and any(m in stdout + stderr for m in _CANNOT_ENTER):
            # The runtime could not even enter the container: it is dying or gone, not the command's fault.
            raise SandboxError(f"sandbox {self.spec.name} is not running: {(stdout + stderr).strip()[:300]}")
        if not timed_out and (exit_code is None or exit_code >= 126):
            await self._raise_if_gone()  # killed by a signal, or not started: maybe with its container
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def _exec_create(
        self, argv: list[str], pidfile: str, cwd: str | None, env: dict[str, str] | None, user: str | None
    ) -> str:
        created = self._api.exec_create(
            self.container.id,
            ["sh", "-c", _WRAPPER, pidfile, *argv],
            environment=env or None,
            # The root is a fine place to run a command (an image whose WORKDIR is /), not a target.
            workdir=posixpath.normpath(posixpath.join(self.spec.workdir, cwd or self.spec.workdir)),
            user=user or "",
        )
        return created["Id"]

    async def _wait(self, reader: asyncio.Future, exec_id: str, timeout_s: float | None) -> bool:
        """Wait for the output to end; True if the timeout hit first.

        The exec's main process can exit while a background child keeps stdout open: poll its state
        (backing off to every 2 s) and stop waiting shortly after it is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        interval = 0.25
        while True:
            wait_s = interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
            done, _ = await asyncio.wait({reader}, timeout=wait_s)
            if done:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return True
            info = await _blocking(self._api.exec_inspect, exec_id)
            if not info.get("Running"):
                await asyncio.wait({reader}, timeout=1.0)
                return False
            interval = min(interval * 2, 2.0)

    def _kill_exec(self, exec_id: str, pidfile: str) -> None:
        """Kill the timed-out command's process group, from the host when the engine is local."""
        info = self._api.exec_inspect(exec_id)
        host_pid = info.get("Pid") or 0
        if host_pid and _belongs_to(host_pid, self.container.id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(host_pid, 9)
                return
        # Remote engine: read the group id the wrapper wrote and kill it from inside (shell builtins
        # only, so it still works when a fork bomb has used up the pids).
        script = f'read p <{shlex.quote(pidfile)} && kill -9 -- -"$p"; rm -f {shlex.quote(pidfile)}'
        for _ in range(5):
            with contextlib.suppress(Exception):
                kill_id = self._api.exec_create(self.container.id, ["sh", "-c", script], user="0")["Id"]
                self._api.exec_start(kill_id)
                if not self._api.exec_inspect(exec_id).get("Running"):
                    return
            time.sleep(0.2)
        log.warning("could not kill a timed-out command in %s; it stops with the sandbox", self.name)

    # -- files ------------------------------------------------------------------------------------

    async def upload_file(self, data: bytes | Path, remote_path: str) -> None:
        self._check_running()
        target = self._absolute(remote_path)
        payload = data.read_bytes() if isinstance(data, Path) else data
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size = len(payload)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(payload))
        await self._put_archive(archive.getvalue(), remote_path)

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        self._check_running()
        if not Path(local_dir).is_dir():
            raise SandboxError(f"upload_dir: {local_dir} is not a folder")
        target = self._absolute(remote_dir)

        def build() -> bytes:
            archive = io.BytesIO()
            with tarfile.open(fileobj=archive, mode="w") as tar:
                tar.add(str(local_dir), arcname=target.lstrip("/"), recursive=True)
            return archive.getvalue()

        await self._put_archive(await _blocking(build), remote_dir)

    async def _put_archive(self, data: bytes, remote: str) -> None:
        try:
            # Extracting at / with the full path lets the engine create missing parent folders.
            ok = await _blocking(self.container.put_archive, "/", data)
        except Exception as exc:
            raise SandboxError(f"upload to {remote} in {self.name} failed: {exc}") from exc
        if not ok:
            raise SandboxError(f"upload to {remote} in {self.name} failed")

    async def download_file(self, remote_path: str) -> bytes:
        self._check_running()
        path = self._absolute(remote_path)
        for _ in range(10):  # follow symlinks inside the container, where they mean what they say
            with await _blocking(self._fetch_archive, path) as tar:
                member = tar.next()
                if member is None:
                    raise FileNotFoundError(f"{remote_path} not found in sandbox {self.spec.name}")
                if member.issym():
                    path = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
                    continue
                if not member.isfile():
                    raise FileNotFoundError(f"{remote_path} is not a file in sandbox {self.spec.name}")
                handle = tar.extractfile(member)
                return handle.read() if handle else b""
        raise SandboxPathError(f"{remote_path}: too many levels of symbolic links")

    async def download_dir(self, remote_dir: str, local_dir: Path) -> None:
        self._check_running()
        path = self._absolute(remote_dir)
        local = Path(local_dir)

        def extract() -> None:
            # "/." asks for the folder's contents even when `path` is a symlink to a folder.
            with self._fetch_archive(path.rstrip("/") + "/.") as tar:
                local.mkdir(parents=True, exist_ok=True)
                for member in tar:
                    name = posixpath.normpath(member.name)
                    if name in (".", ""):
                        continue
                    member.name = name
                    try:  # the "data" filter refuses absolute or escaping links, devices, setuid bits
                        safe = tarfile.data_filter(member, str(local))
                    except tarfile.FilterError as exc:
                        log.warning("download from %s: skipping %s (%s)", self.name, member.name, exc)
                        continue
                    tar.extract(safe, str(local), filter="data")

        await _blocking(extract)

    def _fetch_archive(self, path: str) -> tarfile.TarFile:
        import docker.errors

        try:
            chunks, _stat = self.container.get_archive(path)
            # Lives as long as the returned TarFile (freed with it); spills to disk past 16 MiB.
            spool = tempfile.SpooledTemporaryFile(max_size=16 * 1024 * 1024)  # noqa: SIM115
            for chunk in chunks:
                spool.write(chunk)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} not found in sandbox {self.spec.name}") from None
        spool.seek(0)
        return tarfile.open(fileobj=spool, mode="r")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await _blocking(self._remove)

    def _remove(self) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)
        self._backend._forget_container_rules(self.container.name)

    # -- helpers ----------------------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        joined = posixpath.normpath(posixpath.join(self.spec.workdir, path))
        if joined in ("/", "//"):
            raise SandboxPathError(f"{path!r}: the sandbox root itself cannot be a target")
        return joined

    def _check_running(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.spec.name} is stopped")

    async def _raise_if_gone(self) -> None:
        """SandboxError when the container was removed or stopped from outside (not the command's doing)."""
        try:
            state = (await _blocking(self._api.inspect_container, self.container.id))["State"]
        except Exception as exc:
            if not _is_docker_error(exc):
                raise
            raise SandboxError(f"sandbox {self.spec.name} is not running: {exc}") from exc
        if not state.get("Running") or state.get("Status") == "removing":
            raise SandboxError(f"sandbox {self.spec.name} is not running: container {state.get('Status')}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class _Capture:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[list[bytes]] = [[], []]
        self.kept = [0, 0]
        self.dropped = [0, 0]

    def add(self, index: int, chunk: bytes | None) -> None:
        if not chunk:
            return
        room = self.limit - self.kept[index]
        if room > 0:
            self.parts[index].append(chunk[:room])
            self.kept[index] += min(room, len(chunk))
        self.dropped[index] += max(0, len(chunk) - max(room, 0))

    def text(self, index: int) -> str:
        text = b"".join(self.parts[index]).decode("utf-8", errors="replace")
        if self.dropped[index]:
            text += f"\n[... {self.dropped[index]} bytes of output dropped]\n"
        return text


def _drain(stream: Any, capture: _Capture) -> None:
    with contextlib.suppress(Exception):  # closing the stream from another thread ends it with an error
        for out, err in stream:
            capture.add(0, out)
            capture.add(1, err)


def _belongs_to(host_pid: int, container_id: str) -> bool:
    try:
        return container_id in Path(f"/proc/{host_pid}/cgroup").read_text()
    except OSError:
        return False


def _image_workdir(client: Any, image: str) -> str:
    config = client.images.get(image).attrs.get("Config") or {}
    return config.get("WorkingDir") or "/"


def _policy_key(mode: NetworkMode, hosts: list[str]) -> tuple[str, tuple[str, ...]]:
    return mode, tuple(sorted({normalize_host(h) for h in hosts})) if mode == "allowlist" else ()


def _container_ip(container: Any, network_name: str) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][network_name]["IPAddress"]


def _interface_ipv4(name: str) -> str | None:
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", name], capture_output=True, text=True)
    parts = done.stdout.split()
    return parts[3].split("/")[0] if len(parts) > 3 else None


def _is_docker_error(exc: BaseException) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.DockerException)


def gpu_requests(count: int) -> list[Any]:
    """What `--gpus N` asks the engine for (the NVIDIA runtime picks the devices)."""
    if count <= 0:
        return []
    import docker.types

    return [docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])]


def _is_gpu_refusal(exc: BaseException) -> bool:
    """The engine's answer when it has no GPU runtime (no NVIDIA container toolkit)."""
    text = str(exc).lower()
    return any(
        m in text for m in ("could not select device driver", "nvidia-container", "runtime name: nvidia")
    )


def gpu_refusal(spec: SandboxSpec, exc: BaseException) -> str:
    return (
        f"{spec.name} asks for {spec.gpus} GPU(s) and the Docker engine cannot attach them ({exc}); "
        "run it on a host with GPUs and the NVIDIA container toolkit, or without gpus"
    )


def owner_alive(owner: str) -> bool:
    """Whether the `pid@host` owner label names a live process, or one on another host (not ours to
    judge). No owner at all counts as gone."""
    pid, _, owner_host = owner.partition("@")
    if owner_host and owner_host != socket.gethostname():
        return True  # another machine's sandbox on a shared engine
    return bool(owner_host) and pid.isdigit() and _pid_alive(int(pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip(".-") or "sandbox"
