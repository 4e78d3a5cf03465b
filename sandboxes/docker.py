"""The `docker` backend: one container per rollout on a real Docker engine (Docker SDK, in threads).

Containers are labelled (`harbor-rl.sandbox=1`, `harbor-rl.owner=<pid>@<host>`), limited (CPU, memory
without swap, pids), kept alive by `sleep infinity` under docker-init, and removed on stop; `sweep()`
removes the ones whose owning process is gone.

Network: every sandbox sits on a harbor-rl bridge network (one per network mode, inter-container
traffic off). The firewall (`_Firewall` below: chains HRL-IN and HRL-FWD hooked from
INPUT and DOCKER-USER for interfaces `hrl+`) lets a sandbox reach the host only at its network's
gateway on the capture proxy's port; forwarded traffic is dropped for `no-network`, allowed for
`public`, and allowed per container to the resolved `allowed_hosts` for `allowlist`. When the proxy
listens on 127.0.0.1 only, a small TCP forwarder on gateway:port carries the traffic to it.
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

from sandboxes.base import ExecResult, NetworkMode, SandboxSpec
from sandboxes.errors import SandboxError, SandboxPathError, SandboxUnavailable
from sandboxes.images import ImageBuilder

log = logging.getLogger(__name__)

SANDBOX_LABEL = "harbor-rl.sandbox"
OWNER_LABEL = "harbor-rl.owner"
NAME_LABEL = "harbor-rl.name"
NETWORK_LABEL = "harbor-rl.network"
_NETWORKS: dict[str, tuple[str, str]] = {
    # mode: (network name, bridge interface; <= 15 characters, all matching the `hrl+` rules)
    "no-network": ("harbor-rl-nonet", "hrl-nonet0"),
    "public": ("harbor-rl-public", "hrl-public0"),
    "allowlist": ("harbor-rl-allow", "hrl-allow0"),
}
_CHAIN_IN, _CHAIN_FWD = "HRL-IN", "HRL-FWD"
_IFACE_MATCH = "hrl+"
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
        client = await _blocking(self._connect)
        image = await _blocking(self.builder.image_for, spec)
        if spec.workdir is None:  # the image's own WORKDIR, as Harbor runs it
            spec = spec.model_copy(update={"workdir": await _blocking(_image_workdir, client, image)})
        allowed = (
            await _blocking(_resolve_hosts, spec.allowed_hosts) if spec.network_mode == "allowlist" else {}
        )
        for attempt in (1, 2):
            network = await _blocking(self._network_for, spec.network_mode)
            if spec.proxy_port is not None:
                await _blocking(self._allow_proxy_port, network, spec.proxy_port)
                await self._ensure_forwarder(network, spec.proxy_port)
            try:
                container = await _blocking(self._run_container, client, spec, image, network, allowed)
                break
            except _NetworkGone:
                # Another process removed the idle network between our setup and the start: redo it.
                self._networks.pop(spec.network_mode, None)
                if attempt == 2:
                    raise SandboxError(
                        f"network {network.name} keeps disappearing; is another process removing it?"
                    ) from None
        sandbox = DockerSandbox(spec, container, network, backend=self)
        try:
            if self.firewall:  # re-check: the rules must be in place while the sandbox runs
                await _blocking(self._ensure_firewall)
            if allowed:
                ip = await _blocking(_container_ip, container, network.name)
                await _blocking(self._allow_hosts_for, container.name, ip, sorted(set(allowed.values())))
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
        return (
            f"docker: engine {info.get('ServerVersion')}, storage {info.get('Driver')}, "
            f"base image {base}, firewall {'on' if self.firewall else 'OFF'}"
        )

    async def sweep(self) -> int:
        """Remove containers whose owner process on this host is gone (or that have no owner)."""
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
        client = self._connect()
        removed = 0
        host = socket.gethostname()
        for container in client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}=1"}):
            owner = container.labels.get(OWNER_LABEL, "")
            pid, _, owner_host = owner.partition("@")
            if owner_host == host and pid.isdigit() and _pid_alive(int(pid)):
                continue
            if owner_host and owner_host != host:
                continue  # another machine's sandbox on a shared engine
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
                self._forget_container_rules(container.name)
        return removed

    # -- networks and firewall --------------------------------------------------------------------

    def _network_for(self, mode: NetworkMode) -> _Network:
        with self._setup_lock:
            if self.firewall:
                _Firewall.install()  # idempotent and cheap (iptables -C checks); rules may have been removed
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
                _Firewall.forget_other_gateways(bridge, self._networks[mode].gateway)
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
            _Firewall.install()

    def _allow_proxy_port(self, network: _Network, port: int) -> None:
        if self.firewall:
            with self._setup_lock:
                _Firewall.allow_proxy(network.bridge, network.gateway, port)

    def _allow_hosts_for(self, container_name: str, ip: str, addresses: list[str]) -> None:
        if self.firewall:
            with self._setup_lock:
                _Firewall.allow_hosts(container_name, ip, addresses)

    def _forget_container_rules(self, container_name: str) -> None:
        if self.firewall:
            with self._setup_lock:
                _Firewall.remove_comment(f"harbor-rl:{container_name}")

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
            _Firewall.uninstall()
        return True

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


class DockerSandbox:
    def __init__(
        self, spec: SandboxSpec, container: Any, network: _Network, *, backend: DockerBackend
    ) -> None:
        self.spec = spec
        self.container = container
        self.network = network
        self._backend = backend
        self._api = backend._connect().api
        self._stopped = False

    @property
    def proxy_host(self) -> str:
        return self.network.gateway

    @property
    def name(self) -> str:
        return self.container.name

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
            workdir=self._absolute(cwd or self.spec.workdir),
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


class _Firewall:
    """iptables rules confining harbor-rl bridges; every change is idempotent."""

    @staticmethod
    def install() -> None:
        _iptables("-N", _CHAIN_IN, check=False)
        _iptables("-N", _CHAIN_FWD, check=False)
        if not _iptables("-L", "DOCKER-USER", "-n", check=False):
            _iptables("-N", "DOCKER-USER", check=False)
            _ensure_rule("FORWARD", "-j", "DOCKER-USER")
        _ensure_rule("INPUT", "-i", _IFACE_MATCH, "-j", _CHAIN_IN)
        _ensure_rule("DOCKER-USER", "-i", _IFACE_MATCH, "-j", _CHAIN_FWD)
        _ensure_rule(
            _CHAIN_IN, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT", append=True
        )
        for chain in (_CHAIN_IN, _CHAIN_FWD):  # earlier versions ended in DROP: converge on REJECT
            while _iptables("-D", chain, "-j", "DROP", check=False) is not None:
                pass
        _ensure_rule(_CHAIN_IN, "-j", "REJECT", append=True)  # fails fast, agents do not hang
        _ensure_rule(_CHAIN_FWD, "-i", _NETWORKS["public"][1], "-j", "RETURN", append=True)
        _ensure_rule(_CHAIN_FWD, "-j", "REJECT", append=True)

    @staticmethod
    def allow_proxy(bridge: str, gateway: str, port: int) -> None:
        _ensure_rule(
            _CHAIN_IN, "-i", bridge, "-d", gateway, "-p", "tcp", "--dport", str(port), "-j", "ACCEPT"
        )

    @staticmethod
    def forget_other_gateways(bridge: str, gateway: str) -> None:
        listing = _iptables("-S", _CHAIN_IN, check=False) or ""
        for line in listing.splitlines():
            words = shlex.split(line)
            stale = (
                f"-i {bridge} " in f"{line} "
                and "--dport" in words
                and "-d" in words
                and words[words.index("-d") + 1].split("/")[0] != gateway
            )
            if stale:
                _iptables("-D", *words[1:], check=False)

    @staticmethod
    def allow_hosts(container_name: str, ip: str, addresses: list[str]) -> None:
        comment = ["-m", "comment", "--comment", f"harbor-rl:{container_name}"]
        for address in addresses:
            _ensure_rule(_CHAIN_IN, "-s", ip, "-d", address, *comment, "-j", "ACCEPT")
            _ensure_rule(_CHAIN_FWD, "-s", ip, "-d", address, *comment, "-j", "RETURN")

    @staticmethod
    def remove_comment(comment: str) -> None:
        for chain in (_CHAIN_IN, _CHAIN_FWD):
            listing = _iptables("-S", chain, check=False) or ""
            for line in listing.splitlines():
                if f'"{comment}"' in line or f" {comment} " in f"{line} ":
                    _iptables("-D", *shlex.split(line)[1:], check=False)

    @staticmethod
    def uninstall() -> None:
        for chain, hook in ((_CHAIN_IN, "INPUT"), (_CHAIN_FWD, "DOCKER-USER")):
            while _iptables("-C", hook, "-i", _IFACE_MATCH, "-j", chain, check=False) is not None:
                _iptables("-D", hook, "-i", _IFACE_MATCH, "-j", chain, check=False)
            _iptables("-F", chain, check=False)
            _iptables("-X", chain, check=False)


def _iptables(*args: str, check: bool = True) -> str | None:
    """Run iptables; returns stdout, or None on failure when `check` is False."""
    try:
        done = subprocess.run(["iptables", "-w", "10", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise SandboxUnavailable(
            "iptables is not installed; the docker backend needs it to confine sandboxes "
            "(or pass firewall=False to trust the host's own network setup)"
        ) from exc
    if done.returncode != 0:
        if check:
            raise SandboxUnavailable(
                f"iptables {' '.join(args)} failed: {done.stderr.strip()} (the docker backend needs root "
                "to confine sandboxes; pass firewall=False to trust the host's own network setup)"
            )
        return None
    return done.stdout


def _ensure_rule(chain: str, *rule: str, append: bool = False) -> None:
    if _iptables("-C", chain, *rule, check=False) is None:
        _iptables("-A" if append else "-I", chain, *([] if append else ["1"]), *rule)


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


def _container_ip(container: Any, network_name: str) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][network_name]["IPAddress"]


def _resolve_hosts(hosts: list[str]) -> dict[str, str]:
    """Resolve allowlisted names on the host (pinned into /etc/hosts, so sandboxes need no DNS)."""
    resolved: dict[str, str] = {}
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise SandboxError(f"allowed host {host!r} does not resolve: {exc}") from exc
        resolved[host] = infos[0][4][0]
    return resolved


def _interface_ipv4(name: str) -> str | None:
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", name], capture_output=True, text=True)
    parts = done.stdout.split()
    return parts[3].split("/")[0] if len(parts) > 3 else None


def _is_docker_error(exc: BaseException) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.DockerException)


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
