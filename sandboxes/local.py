"""The `local` backend: a process per exec in a per-rollout folder, isolated with bubblewrap when present.

Each rollout gets `ROOT/<name>-<id>/fs/`, whose top-level folders (`app`, `logs`, `tests`, `tmp`,
`root`, ...) are bound at `/app`, `/logs`, ... inside a bwrap namespace, while the host's `/usr`,
`/lib*` and `/etc` are bound read-only and stand in for the `harbor-rl/sandbox-base` image. So tasks
see the same paths as in a container. Environment variables are cleared: only the image's `ENV`, the
spec's env and a sane PATH/HOME enter, so host secrets never do.

The network (`sandboxes/local_network.py`), what each mode reaches:

    mode         where each exec runs                               reaches
    no-network   its own empty namespace (bwrap --unshare-net)      the capture proxy only
    public       the sandbox's namespace, slirp4netns + nft filter  the internet and the proxy; no
                                                                    address of the host (loopback,
                                                                    LAN IPs, Docker gateways), no
                                                                    private or link-local range
    allowlist    the same namespace, filtered to the pinned         the listed hosts (pinned in
                 addresses of the listed hosts                      /etc/hosts, no DNS) and the proxy

The capture proxy is at 127.0.0.1:<port> in every mode, the address the harness is given.
`apply_network` narrows it for a phase (an agent phase without network, the verifier with it).
Provisioning (the Dockerfile's `RUN` steps, harness layers) runs with internet but without the host,
as `docker build` does on its bridge. A mode that cannot be isolated here (no usable bwrap; no
slirp4netns, nft or socat) is refused in one line (`network_refusal`), never run on the host's
network; only `isolation="none"`, asked for by name, runs commands on the host, network included. No
CPU or memory limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Literal

from sandboxes import layer_cache, local_network
from sandboxes.base import ExecResult, ImageLayer, NetworkMode, SandboxSpec
from sandboxes.dockerfile import (
    Instruction,
    parse_dockerfile,
    parse_dockerfile_text,
    parse_env_args,
    substitute,
)
from sandboxes.errors import (
    SandboxBuildError,
    SandboxError,
    SandboxPathError,
    SandboxUnavailable,
    UnsupportedEnvironment,
)
from sandboxes.housekeeping import PathStat
from sandboxes.policy import Allowlist, check_narrowing, resolve_allowlist

log = logging.getLogger(__name__)

BASE_IMAGE_PREFIX = "harbor-rl/sandbox-base"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Host folders bound read-only (never writable, never upload/download targets).
_SYSTEM_TOPS = frozenset(
    {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys"}
)
# Folders every rollout gets, so the usual paths exist before the first upload.
_DEFAULT_TOPS = ("app", "logs", "tests", "tmp", "root", "var/tmp")
_SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
_SUGGEST_DOCKER = "use `--sandbox docker` for this task"
_MAX_SYMLINK_HOPS = 40

Isolation = Literal["auto", "bwrap", "none"]
Network = Literal["host", "isolated", "public"]
"""host: the host's own network (isolation="none" only); isolated: each exec in an empty namespace
with the proxy; public: the sandbox's slirp4netns namespace, filtered (public or an allow-list)."""


def network_refusal(
    mode: NetworkMode, *, isolation: Isolation = "auto", bwrap_usable: bool | None = None
) -> str | None:
    """Why a local sandbox cannot isolate `mode` on this machine (one line naming the fix), or None.

    `harbor tasks check`, eval, serve and train refuse a task with it up front; `start` refuses the
    same way, so no path runs a task on the host's network unasked."""
    if isolation == "none":
        return None
    if bwrap_usable is None:
        bwrap_usable = bwrap_problem() is None
    if not bwrap_usable:
        return (
            f"network {mode}: bubblewrap (bwrap) is missing or cannot make namespaces here, so a local "
            "sandbox cannot isolate its network (apt-get install bubblewrap); use --sandbox docker"
        )
    if mode in ("public", "allowlist"):
        problem = local_network.public_network_problem()
    else:
        problem = None if local_network.socat_path() else "socat not installed (apt-get install socat)"
    if problem:
        return f"network {mode}: {problem}, so a local sandbox cannot isolate it; use --sandbox docker"
    return None


_BWRAP_PROBLEM: list[str | None] = []


def bwrap_problem() -> str | None:
    """Why bwrap cannot isolate here (missing, or namespaces refused), or None; probed once a process."""
    if not _BWRAP_PROBLEM:
        path = shutil.which("bwrap")
        problem = "bwrap (bubblewrap) is not installed" if path is None else None
        if path is not None:
            probe = subprocess.run(
                [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if probe.returncode != 0:
                problem = f"bwrap cannot create namespaces here: {probe.stderr.strip()}"
        _BWRAP_PROBLEM.append(problem)
    return _BWRAP_PROBLEM[0]


def default_root() -> Path:
    """Where per-rollout folders live: `$HARBOR_RUNS_DIR/tmp/sandboxes` (default `runs/`)."""
    return Path(os.environ.get("HARBOR_RUNS_DIR", "runs")).resolve() / "tmp" / "sandboxes"


def default_layer_cache(root: Path | str | None) -> Path:
    """`<root>/.layer-cache` for a backend given its own root; otherwise `$HARBOR_CACHE_DIR/local-layers`
    (default `~/.cache/harbor-rl`), so a run from a new folder does not install mini-swe-agent again
    (~40 s a run)."""
    if root is not None:
        return Path(root).resolve() / ".layer-cache"
    cache = os.environ.get("HARBOR_CACHE_DIR") or Path.home() / ".cache" / "harbor-rl"
    return Path(cache) / "local-layers"


LOCAL_DEFAULT_WORKDIR = "/app"
"""Where a local sandbox starts when neither the task nor its Dockerfile names a WORKDIR."""


class LocalBackend:
    """Sandboxes that are folders on this machine plus bwrap namespaces."""

    name = "local"

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        isolation: Isolation = "auto",
        max_output_bytes: int = 8 * 1024 * 1024,
        host_python: bool = True,
        layer_cache_dir: Path | str | None = None,
    ) -> None:
        """`isolation`: auto uses bwrap when it works, bwrap requires it, none never uses it.
        `host_python`: bind this interpreter's prefix read-only and put it first on PATH, so tests find
        pytest even when the host's /usr/bin/python3 lacks it. `layer_cache_dir`: where installed harness
        layers are kept (default: `<root>/.layer-cache` for an explicit `root`, else the user's cache)."""
        self.root = Path(root).resolve() if root else default_root()
        self.isolation = isolation
        self.max_output_bytes = max_output_bytes
        self.host_python = host_python
        self.layer_cache = Path(layer_cache_dir).resolve() if layer_cache_dir else default_layer_cache(root)
        """Harness layers' files, installed once and reused by each new sandbox."""
        self._bwrap: bool | None = None
        self._layer_locks: dict[str, asyncio.Lock] = {}
        """One first install per layer at a time: sandboxes started together wait and reuse it."""

    # -- protocol ---------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        if spec.compose_file is not None:
            raise UnsupportedEnvironment(
                f"environment/{spec.compose_file.name}: the local sandbox cannot run Docker Compose; "
                f"{_SUGGEST_DOCKER}"
            )
        if spec.gpus:
            raise UnsupportedEnvironment(
                f"the local sandbox cannot attach GPUs (gpus = {spec.gpus}); {_SUGGEST_DOCKER}"
            )
        if spec.workdir is None:  # no WORKDIR anywhere: a local sandbox has no image to ask
            spec = spec.model_copy(update={"workdir": LOCAL_DEFAULT_WORKDIR})
        use_bwrap = await self._use_bwrap()
        folder = self.root / f"{_safe_name(spec.name)}-{uuid.uuid4().hex[:8]}"
        network = self._network_for(spec.network_mode, use_bwrap)
        allow = await _allowlist(spec.network_mode, spec.allowed_hosts)
        sandbox = LocalSandbox(spec, folder, use_bwrap=use_bwrap, backend=self)
        try:
            await asyncio.to_thread(sandbox._create_layout)
            # Provisioning has internet but not the host, as `docker build` on its bridge.
            await sandbox._enter_network(self._network_for("public", use_bwrap))
            await _Provisioner(sandbox).run()
            await sandbox._enter_network(network, allow)
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    async def health(self) -> str:
        if await self._use_bwrap():
            problem = network_refusal("public", isolation=self.isolation, bwrap_usable=True)
            net = f"refuses {problem}" if problem else "internet without the host (slirp4netns)"
            return f"local: ready, bubblewrap isolation, {net}, folders under {self.root}"
        if self.isolation == "none":
            return f"local: ready WITHOUT isolation (asked for), folders under {self.root}"
        return f"local: refuses every task: {bwrap_problem()}; folders under {self.root}"

    async def sweep(self) -> int:
        """Remove rollout folders whose owning process on this host is gone."""
        return await asyncio.to_thread(self._sweep)

    # -- internals --------------------------------------------------------------------------------

    def _network_for(self, mode: NetworkMode, use_bwrap: bool) -> Network:
        """Where a network mode puts this sandbox; a mode it cannot isolate is refused, one line."""
        if self.isolation == "none":
            return "host"  # asked for by name: no isolation at all
        refusal = network_refusal(mode, isolation=self.isolation, bwrap_usable=use_bwrap)
        if refusal:
            raise UnsupportedEnvironment(f"the local sandbox refuses {refusal}")
        return "isolated" if mode == "no-network" else "public"

    def _sweep(self) -> int:
        if not self.root.is_dir():
            return 0
        removed = 0
        for folder in self.root.iterdir():
            owner = folder / "owner.json"
            try:
                data = json.loads(owner.read_text())
            except (OSError, ValueError):
                continue
            if data.get("host") == socket.gethostname() and _pid_alive(int(data.get("pid", 0))):
                continue
            if data.get("net_folder"):
                shutil.rmtree(data["net_folder"], ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        return removed

    async def _use_bwrap(self) -> bool:
        if self._bwrap is None:
            self._bwrap = await asyncio.to_thread(self._probe_bwrap)
        return self._bwrap

    def _probe_bwrap(self) -> bool:
        if self.isolation == "none":
            return False
        problem = bwrap_problem()
        if problem is None:
            return True
        if self.isolation == "bwrap":
            raise SandboxUnavailable(f"local sandbox isolation was required but {problem}")
        log.warning(
            "%s: local sandboxes cannot isolate commands, so tasks are refused on them; install "
            "bubblewrap (apt-get install bubblewrap) or use --sandbox docker",
            problem,
        )
        return False


class LocalSandbox:
    """One rollout's folder; every exec is a fresh process tree over the same folders."""

    def __init__(self, spec: SandboxSpec, folder: Path, *, use_bwrap: bool, backend: LocalBackend) -> None:
        self.spec = spec
        self.folder = folder
        self.fs = folder / "fs"
        self.use_bwrap = use_bwrap
        self._backend = backend
        self._image_env: dict[str, str] = {}
        self._default_user: str | None = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._stopped = False
        self.network: Network = "host"
        """`isolated`: each exec in its own network namespace, the proxy forwarded in (see start);
        `public`: each exec in the sandbox's slirp4netns namespace, filtered by `_allow`."""
        self._forwarder: local_network.ProxyForwarder | None = None
        self._allow: Allowlist | None = None
        """The allow-list a `public` namespace is filtered to; None: the internet without the host."""
        self._public: local_network.PublicNamespace | None = None
        """Made by the first exec that needs it (a sandbox whose commands never need internet has none)."""
        self._public_lock = asyncio.Lock()
        self._layer_binds: list[tuple[Path, str]] = []
        """Cached harness layer folders bound read-only (see layer_cache.restore)."""

    @property
    def processes_outlive_exec(self) -> bool:
        # Under bwrap each exec is a PID namespace of its own, and the kernel kills everything in it when
        # the command ends. Without bwrap a process can leave the exec's group (setsid) and live on.
        return not self.use_bwrap

    @property
    def proxy_host(self) -> str:
        # The host's own address, or in an isolated namespace the forwarder listening at the same one.
        return "127.0.0.1"

    async def _enter_network(self, network: Network, allow: Allowlist | None = None) -> None:
        """From now on every exec runs on `network`; both namespaces get the proxy forwarder (started
        once, kept for later phases). A live public namespace is filtered anew before this returns."""
        if network != "host" and self.spec.proxy_port is not None and self._forwarder is None:
            self._forwarder = local_network.ProxyForwarder(self.spec.proxy_port)
            net_folder = await self._forwarder.start()
            await asyncio.to_thread(self._write_owner, net_folder=str(net_folder))
        self.network, self._allow = network, allow
        if network == "public" and self._public is not None:
            await self._filter(self._public)

    async def _public_namespace(self) -> local_network.PublicNamespace:
        async with self._public_lock:
            if self._public is None:
                forwarder = self._forwarder
                socket_path = (
                    forwarder.folder / local_network.SOCKET_NAME if forwarder and forwarder.folder else None
                )
                namespace = local_network.PublicNamespace(
                    self.folder / "net", socket_path, forwarder.port if forwarder else None
                )
                allow = self._allow
                try:
                    await namespace.start(allow.addresses if allow else None, allow.pins if allow else None)
                except BaseException:
                    await namespace.stop()
                    raise
                self._public = namespace
            return self._public

    async def _filter(self, namespace: local_network.PublicNamespace) -> None:
        if self._allow is None:
            await namespace.apply(None)
        else:
            await namespace.apply(self._allow.addresses, self._allow.pins)

    async def apply_network(self, mode: NetworkMode, allowed_hosts: list[str]) -> None:
        """A phase's network: each later exec runs in its own empty namespace (no-network: only the
        capture proxy) or in the sandbox's namespace, filtered to the internet or to an allow-list."""
        self._check_running()
        check_narrowing(self.spec, mode, allowed_hosts)
        network = self._backend._network_for(mode, self.use_bwrap)
        known = self._allow.pins if self._allow else None
        await self._enter_network(network, await _allowlist(mode, allowed_hosts, known))

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
        workdir = self._absolute(cwd or self.spec.workdir)
        full_env = self._environment(env)
        uid, gid = self._resolve_user(user or self._default_user)
        if self.use_bwrap:
            top = PurePosixPath(workdir).parts[1:2]
            if top and top[0] not in _SYSTEM_TOPS:  # system folders exist already, read-only
                self._host_path(workdir).mkdir(parents=True, exist_ok=True)
            namespace = None
            if self.network == "public":
                namespace = await self._public_namespace()
            elif self._forwarder is not None and self.network == "isolated":
                argv = local_network.launcher_argv(self._forwarder.port, argv)
            args = self._bwrap_args(workdir, full_env, uid, gid, namespace) + ["--", *argv]
            if namespace is not None:
                args = namespace.enter_argv() + args
            return await self._run(args, env={}, cwd=None, timeout_s=timeout_s)
        if (uid, gid) != (os.getuid(), os.getgid()):
            raise UnsupportedEnvironment(f"exec as user {user!r} needs bwrap isolation; {_SUGGEST_DOCKER}")
        host_cwd = self._host_path(workdir, allow_root=True)
        host_cwd.mkdir(parents=True, exist_ok=True)
        return await self._run(argv, env=full_env, cwd=host_cwd, timeout_s=timeout_s)

    async def _run(
        self, argv: list[str], *, env: dict[str, str], cwd: Path | None, timeout_s: float | None
    ) -> ExecResult:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=cwd,
                # Own process group: a timeout kills the whole tree (and with bwrap the pid namespace).
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return ExecResult(exit_code=127, stderr=f"{exc}\n", duration_s=time.monotonic() - started)
        self._procs.add(proc)
        limit = self._backend.max_output_bytes
        readers = [asyncio.create_task(_read_capped(s, limit)) for s in (proc.stdout, proc.stderr)]
        timed_out = False
        try:
            async with asyncio.timeout(timeout_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        except BaseException:
            _kill_group(proc)
            raise
        finally:
            if timed_out or proc.returncode is None:
                _kill_group(proc)
                await proc.wait()
            self._procs.discard(proc)
        # Processes that left the group may still hold the pipes: do not wait for them forever.
        done, pending = await asyncio.wait(readers, timeout=2.0)
        for task in pending:
            task.cancel()
        _kill_group(proc)
        out, err = (t.result() if t in done else "" for t in readers)
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=out,
            stderr=err,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def _bwrap_args(
        self,
        workdir: str,
        env: dict[str, str],
        uid: int,
        gid: int,
        namespace: local_network.PublicNamespace | None = None,
    ) -> list[str]:
        # --share-net keeps the network bwrap starts in: the host's (isolation none) or, after nsenter,
        # the sandbox's public namespace.
        args = [
            "bwrap", "--unshare-all", *(["--share-net"] if self.network != "isolated" else []),
            "--die-with-parent", "--new-session",
            "--hostname", _safe_name(self.spec.name)[:63],
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / top
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        args += ["--ro-bind", "/etc", "/etc", "--ro-bind", str(self.folder / "profile"), "/etc/profile"]
        if namespace is not None:  # slirp's DNS (the host's resolvers are filtered out), pinned names
            args += ["--ro-bind", str(namespace.resolv_conf), "/etc/resolv.conf"]
            args += ["--ro-bind", str(namespace.hosts_file), "/etc/hosts"]
        for secret in _SECRET_FILES:
            if os.path.exists(secret):
                args += ["--ro-bind", "/dev/null", secret]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for top in sorted(p.name for p in self.fs.iterdir() if p.is_dir() and not p.is_symlink()):
            args += ["--bind", str(self.fs / top), f"/{top}"]
        for cached, inside in self._layer_binds:
            args += ["--ro-bind", str(cached), inside]
        if self.network == "isolated" and self._forwarder is not None and self._forwarder.folder is not None:
            args += ["--ro-bind", str(self._forwarder.folder), local_network.NAMESPACE_DIR]
        for prefix in self._python_prefixes():
            args += ["--ro-bind", prefix, prefix]
        args += ["--chdir", workdir, "--uid", str(uid), "--gid", str(gid), "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        return args

    def _environment(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {"PATH": self._default_path(), "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(self._image_env)
        env.update(self.spec.env)
        env.update(extra or {})
        return env

    def _default_path(self) -> str:
        if not self.use_bwrap:
            return DEFAULT_PATH
        return ":".join([f"{p}/bin" for p in self._python_prefixes()] + [DEFAULT_PATH])

    def _python_prefixes(self) -> list[str]:
        if not (self._backend.host_python and self.use_bwrap):
            return []
        prefixes = []
        for prefix in dict.fromkeys([sys.prefix, sys.base_prefix]):
            top = PurePosixPath(prefix).parts[1] if len(PurePosixPath(prefix).parts) > 1 else ""
            if top and top not in _SYSTEM_TOPS and Path(prefix, "bin").is_dir():
                prefixes.append(prefix)
        return prefixes

    def _resolve_user(self, user: str | None) -> tuple[int, int]:
        if user is None:
            return (0, 0) if self.use_bwrap else (os.getuid(), os.getgid())
        name, _, group = user.partition(":")
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
            uid, gid = entry.pw_uid, entry.pw_gid
        except KeyError:
            if not name.isdigit():
                raise SandboxError(f"unknown user {user!r} (not in /etc/passwd)") from None
            uid = gid = int(name)
        if group:
            if not group.isdigit():
                raise SandboxError(f"user {user!r}: give the group as a number")
            gid = int(group)
        return uid, gid

    # -- files ------------------------------------------------------------------------------------

    async def upload_file(self, data: bytes | Path, remote_path: str) -> None:
        self._check_running()
        remote = self._absolute(remote_path)
        parent, name = posixpath.split(remote)
        if parent == "/":
            raise SandboxPathError(f"{remote_path}: files cannot be written at the sandbox root")
        await asyncio.to_thread(_write_file, data, self._host_path(parent) / name)

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        self._check_running()
        if not Path(local_dir).is_dir():
            raise SandboxError(f"upload_dir: {local_dir} is not a folder")
        await asyncio.to_thread(self._upload_tree, Path(local_dir), self._absolute(remote_dir))

    def _upload_tree(self, local_dir: Path, remote_dir: str) -> None:
        """Copy a host folder in, resolving every destination the sandbox's way.

        A plain copytree would follow a symlink the agent planted at a destination path
        (`/tests/test.sh -> /etc/passwd` means the HOST's file to the host) and write through it."""
        for root, dirs, files in os.walk(local_dir):
            relative = os.path.relpath(root, local_dir)
            remote_root = posixpath.normpath(posixpath.join(remote_dir, relative))
            host_root = self._host_path(remote_root)
            host_root.mkdir(parents=True, exist_ok=True)
            for name in files + [d for d in dirs if Path(root, d).is_symlink()]:
                source = Path(root, name)
                if source.is_symlink():
                    link = host_root / name
                    if link.is_symlink() or link.is_file():
                        link.unlink()
                    link.symlink_to(os.readlink(source))
                    continue
                _write_file(source, host_root / name)

    async def download_file(self, remote_path: str) -> bytes:
        self._check_running()
        source = self._host_path(self._absolute(remote_path))
        if not source.is_file():
            raise FileNotFoundError(f"{remote_path} is not a file in sandbox {self.spec.name}")
        return await asyncio.to_thread(source.read_bytes)

    async def download_dir(self, remote_dir: str, local_dir: Path) -> None:
        self._check_running()
        source = self._host_path(self._absolute(remote_dir))
        if not source.is_dir():
            raise FileNotFoundError(f"{remote_dir} is not a folder in sandbox {self.spec.name}")
        await asyncio.to_thread(copy_tree_safely, source, Path(local_dir))

    # Housekeeping on the host's folders, where other backends run a command per question.

    async def make_dirs(self, paths: list[str], *, mode: int = 0o777) -> None:
        self._check_running()
        await asyncio.to_thread(self._make_dirs, [self._absolute(p) for p in paths], mode)

    def _make_dirs(self, paths: list[str], mode: int) -> None:
        for path in paths:
            folder = self._host_path(path)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(mode)
            except OSError as exc:
                raise SandboxError(f"could not make {path}: {exc}") from exc

    async def reset_dir(self, path: str, *, mode: int | None = None) -> None:
        self._check_running()
        await asyncio.to_thread(self._reset_dir, self._absolute(path), mode)

    def _reset_dir(self, path: str, mode: int | None) -> None:
        parent, name = posixpath.split(path)
        if not name or (parent == "/" and name in _SYSTEM_TOPS):
            raise SandboxPathError(f"{path}: not a folder of the sandbox's own to reset")
        folder = self._host_path(parent, allow_root=True) / name  # the folder itself is never followed
        try:
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                folder.unlink()
            folder.mkdir(parents=True, exist_ok=True)
            for entry in folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            if mode is not None:
                folder.chmod(mode)
        except OSError as exc:
            raise SandboxError(f"could not reset {path}: {exc}") from exc

    async def stat_path(self, path: str) -> PathStat | None:
        self._check_running()
        return await asyncio.to_thread(self._stat_path, self._absolute(path))

    def _stat_path(self, path: str) -> PathStat | None:
        try:
            host = self._host_path(path)
        except SandboxPathError:  # the host's read-only system folders, which the sandbox sees as they are
            host = Path(path)
        if host.is_dir():
            return PathStat(kind="dir", entries=sum(1 for _ in host.iterdir()))
        if host.is_file():
            return PathStat(kind="file", size=host.stat().st_size)
        return PathStat(kind="other") if host.exists() else None

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for proc in list(self._procs):
            _kill_group(proc)
        if self._public is not None:
            await self._public.stop()
        if self._forwarder is not None:
            await self._forwarder.stop()
        await asyncio.to_thread(shutil.rmtree, self.folder, True)

    # -- paths ------------------------------------------------------------------------------------

    def _absolute(self, path: str) -> str:
        joined = posixpath.join(self.spec.workdir, path)
        return posixpath.normpath(joined) if joined.startswith("/") else posixpath.normpath("/" + joined)

    def _host_path(self, remote: str, *, allow_root: bool = False) -> Path:
        """Map an absolute sandbox path to the host, following symlinks the way the sandbox would.

        Absolute link targets restart at the sandbox root, so nothing resolves outside `fs/`; the
        host's read-only system folders are refused because they are not the sandbox's to write."""
        todo = list(PurePosixPath(remote).parts[1:])
        current = self.fs
        hops = 0
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                current = current.parent if current != self.fs else current
                continue
            candidate = current / part
            if candidate.is_symlink():
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise SandboxPathError(f"{remote}: too many levels of symbolic links")
                target = PurePosixPath(os.readlink(candidate))
                if target.is_absolute():
                    current, todo = self.fs, list(target.parts[1:]) + todo
                else:
                    todo = list(target.parts) + todo
                continue
            current = candidate
        relative = current.relative_to(self.fs)
        if not relative.parts:
            if allow_root:
                return current
            raise SandboxPathError(f"{remote}: the sandbox root itself cannot be read or written")
        if relative.parts[0] in _SYSTEM_TOPS:
            raise SandboxPathError(
                f"{remote}: /{relative.parts[0]} is the host's read-only system folder in a local sandbox"
            )
        return current

    def _create_layout(self) -> None:
        self.fs.mkdir(parents=True)
        for top in _DEFAULT_TOPS:
            (self.fs / top).mkdir(parents=True, exist_ok=True)
        self._host_path(self._absolute(self.spec.workdir)).mkdir(parents=True, exist_ok=True)
        self._write_owner()
        # `bash -l` sources /etc/profile, which resets PATH; keep the host Python first on it.
        profile = Path("/etc/profile").read_text() if Path("/etc/profile").is_file() else ""
        prefixes = ":".join(f"{p}/bin" for p in self._python_prefixes())
        if prefixes:
            profile += f'\n# harbor-rl local sandbox: the host Python stands in for the base image\nexport PATH="{prefixes}:$PATH"\n'
        (self.folder / "profile").write_text(profile)

    def _write_owner(self, **extra: str) -> None:
        """Who owns this folder (and what else to remove with it), for `sweep` after a crash."""
        owner = {"pid": os.getpid(), "host": socket.gethostname(), **extra}
        (self.folder / "owner.json").write_text(json.dumps(owner))

    def _check_running(self) -> None:
        if self._stopped:
            raise SandboxError(f"sandbox {self.spec.name} is stopped")


class _Provisioner:
    """Apply the safe subset of a task Dockerfile (and harness layers) to a fresh local sandbox."""

    _IGNORED = frozenset(
        {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK", "VOLUME"}
    )

    def __init__(self, sandbox: LocalSandbox) -> None:
        self.sandbox = sandbox
        self.spec = sandbox.spec
        self.workdir = "/"
        self.variables: dict[str, str] = {}
        self.deadline = time.monotonic() + self.spec.build_timeout_s

    async def run(self) -> None:
        spec = self.spec
        if spec.environment_dir is None:
            if spec.docker_image and not spec.docker_image.startswith(BASE_IMAGE_PREFIX):
                raise UnsupportedEnvironment(
                    f"the local backend cannot run image {spec.docker_image!r}; {_SUGGEST_DOCKER}"
                )
        else:
            dockerfile_path = Path(spec.environment_dir) / "Dockerfile"
            if not dockerfile_path.is_file():
                raise SandboxBuildError(f"{dockerfile_path} does not exist")
            dockerfile = parse_dockerfile(dockerfile_path)
            await self._apply(dockerfile.instructions, Path(spec.environment_dir), dockerfile_path, task=True)
        for layer in spec.image_layers:
            await self._apply_layer(layer)

    async def _apply_layer(self, layer: ImageLayer) -> None:
        where = Path(f"<layer {layer.name}>")
        instructions = parse_dockerfile_text("\n".join(layer.dockerfile_lines), where).instructions
        context = Path(layer.context_dir) if layer.context_dir else None
        fs, cache_root = self.sandbox.fs, self.sandbox._backend.layer_cache
        key = await asyncio.to_thread(layer_cache.layer_key, layer)
        async with self.sandbox._backend._layer_locks.setdefault(key, asyncio.Lock()):
            entry = layer_cache.lookup(cache_root, key)
            if entry is None:
                await self._install_layer(layer, instructions, context, where, key)
                return
        if self.sandbox.use_bwrap:
            writable = frozenset(_DEFAULT_TOPS) | frozenset(PurePosixPath(self.spec.workdir).parts[1:2])
            binds = await asyncio.to_thread(layer_cache.restore, entry, fs, copy_under=writable)
            self.sandbox._layer_binds += binds
        else:  # nothing to bind into: copy it all
            await asyncio.to_thread(layer_cache.copy_all, entry, fs)
        await self._apply(instructions, context, where, task=False, files=False)

    async def _install_layer(
        self, layer: ImageLayer, instructions: list[Instruction], context: Path | None, where: Path, key: str
    ) -> None:
        fs, cache_root = self.sandbox.fs, self.sandbox._backend.layer_cache
        # The first sandbox with this layer installs it (a pip install: tens of seconds): say so.
        started = time.monotonic()
        log.info(
            "installing layer %s into a local sandbox for the first time (its packages); it is cached, "
            "so later sandboxes bind it in under a second",
            layer.name,
        )
        before = await asyncio.to_thread(layer_cache.snapshot, fs)
        await self._apply(instructions, context, where, task=False)
        await asyncio.to_thread(layer_cache.save, fs, before, cache_root, key)
        log.info(
            "installed layer %s in %.1f s (cached for the next sandboxes)",
            layer.name,
            time.monotonic() - started,
        )

    async def _apply(
        self,
        instructions: Iterable[Instruction],
        context: Path | None,
        where: Path,
        *,
        task: bool,
        files: bool = True,
    ):
        """`files=False` replays only what is not in the sandbox's folder (ENV, WORKDIR, USER): the
        files came from the layer cache."""
        seen_from = not task
        for ins in instructions:
            loc = f"{where}:{ins.line}"
            kw = ins.keyword
            if kw == "FROM":
                self._from(ins, loc, seen_from)
                seen_from = True
            elif kw == "ARG":
                name, sep, default = ins.args.strip().partition("=")
                self.variables.setdefault(name.strip(), substitute(default, self.variables) if sep else "")
            elif not seen_from:
                raise UnsupportedEnvironment(f"{loc}: {kw} before FROM")
            elif kw == "ENV":
                values = {k: substitute(v, self.variables) for k, v in parse_env_args(ins.args).items()}
                self.variables.update(values)
                self.sandbox._image_env.update(values)
            elif kw == "WORKDIR":
                self.workdir = posixpath.normpath(
                    posixpath.join(self.workdir, substitute(ins.args.strip(), self.variables))
                )
                try:
                    self.sandbox._host_path(self.workdir).mkdir(parents=True, exist_ok=True)
                except SandboxPathError as exc:
                    raise UnsupportedEnvironment(f"{loc}: {exc}; {_SUGGEST_DOCKER}") from None
            elif kw in ("COPY", "ADD"):
                if files:
                    await asyncio.to_thread(self._copy, ins, context, loc)
            elif kw == "RUN":
                if files:
                    await self._run(ins, loc)
            elif kw == "USER":
                self.sandbox._default_user = substitute(ins.args.strip(), self.variables) or None
            elif kw in self._IGNORED:
                continue
            else:
                raise UnsupportedEnvironment(
                    f"{loc}: {kw} is not supported by the local sandbox; {_SUGGEST_DOCKER}"
                )

    def _from(self, ins: Instruction, loc: str, seen_from: bool) -> None:
        if seen_from:
            raise UnsupportedEnvironment(
                f"{loc}: multi-stage builds are not supported locally; {_SUGGEST_DOCKER}"
            )
        words = ins.words()
        image = substitute(words[0], self.variables) if words else ""
        if not image.startswith(BASE_IMAGE_PREFIX + ":") and image != BASE_IMAGE_PREFIX:
            raise UnsupportedEnvironment(
                f"{loc}: FROM {image} - the local sandbox only stands in for {BASE_IMAGE_PREFIX}:*; {_SUGGEST_DOCKER}"
            )

    def _copy(self, ins: Instruction, context: Path | None, loc: str) -> None:
        if "from" in ins.flags:
            raise UnsupportedEnvironment(f"{loc}: COPY --from needs a real build; {_SUGGEST_DOCKER}")
        words = [substitute(w, self.variables) for w in ins.words()]
        if len(words) < 2:
            raise SandboxBuildError(f"{loc}: {ins.keyword} needs a source and a destination")
        if context is None:
            raise SandboxBuildError(f"{loc}: {ins.keyword} without a build context")
        *sources, dest = words
        if any("://" in s or s.startswith("git@") for s in sources):
            raise UnsupportedEnvironment(f"{loc}: ADD from a URL is not supported locally; {_SUGGEST_DOCKER}")
        root = context.resolve()
        matched: list[Path] = []
        for source in sources:
            found = (
                sorted(root.glob(source.lstrip("/")))
                if any(c in source for c in "*?[")
                else [root / source.lstrip("/")]
            )
            for path in found:
                resolved = path.resolve()
                if resolved != root and root not in resolved.parents:
                    raise SandboxPathError(f"{loc}: {source} escapes the build context {root}")
                if not resolved.exists():
                    raise SandboxBuildError(f"{loc}: {source} not found in the build context {root}")
                matched.append(resolved)
        dest_abs = posixpath.normpath(posixpath.join(self.workdir, dest))
        try:
            target = self.sandbox._host_path(dest_abs)
        except SandboxPathError as exc:
            raise UnsupportedEnvironment(f"{loc}: {exc}; {_SUGGEST_DOCKER}") from None
        into_dir = dest.endswith("/") or len(matched) > 1 or target.is_dir()
        mode = int(ins.flags["chmod"], 8) if ins.flags.get("chmod") else None
        for source in matched:
            if source.is_dir():
                shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
                continue
            if ins.keyword == "ADD" and tarfile.is_tarfile(source):
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(source) as archive:
                    archive.extractall(target, filter="data")
                continue
            file_target = target / source.name if into_dir else target
            file_target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, file_target)
            if mode is not None:
                file_target.chmod(mode)

    async def _run(self, ins: Instruction, loc: str) -> None:
        command = ins.words() if ins.is_exec_form() else ["/bin/sh", "-c", ins.args]
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise SandboxBuildError(f"{loc}: build timeout of {self.spec.build_timeout_s:.0f}s exceeded")
        result = await self.sandbox.exec(
            command, timeout_s=remaining, cwd=self.workdir, user=self.sandbox._default_user
        )
        if result.timed_out:
            raise SandboxBuildError(
                f"{loc}: RUN exceeded the build timeout of {self.spec.build_timeout_s:.0f}s"
            )
        if result.exit_code != 0:
            tail = (result.stdout + result.stderr)[-2000:]
            raise SandboxBuildError(f"{loc}: RUN exited with {result.exit_code}:\n{tail}")


async def _read_capped(stream: asyncio.StreamReader | None, limit: int) -> str:
    if stream is None:
        return ""
    chunks: list[bytes] = []
    kept = dropped = 0
    while chunk := await stream.read(65536):
        if kept < limit:
            piece = chunk[: limit - kept]
            chunks.append(piece)
            kept += len(piece)
            dropped += len(chunk) - len(piece)
        else:
            dropped += len(chunk)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    return text + (f"\n[... {dropped} bytes of output dropped]\n" if dropped else "")


async def _allowlist(
    mode: NetworkMode, hosts: list[str], known: dict[str, str] | None = None
) -> Allowlist | None:
    """An allow-list's names pinned to addresses (resolved on the host); None for the other modes."""
    if mode != "allowlist":
        return None
    return await asyncio.to_thread(resolve_allowlist, hosts, known=known)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def copy_tree_safely(source: Path, dest: Path) -> None:
    """Copy a sandbox folder out, keeping only symlinks that stay inside it.

    A link the agent planted (`/app/out -> /etc/shadow`) means something else on the host: it is
    neither followed nor recreated, so nothing of the host's comes out or is pointed at."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        dropped = set()
        for name in names:
            path = Path(folder, name)
            if path.is_symlink() and not _link_stays_inside(path, source):
                log.warning("download: skipping symlink %s -> %s (points outside)", path, os.readlink(path))
                dropped.add(name)
        return dropped

    shutil.copytree(source, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def _link_stays_inside(link: Path, root: Path) -> bool:
    target = os.readlink(link)
    if target.startswith("/"):
        return False
    resolved = posixpath.normpath(posixpath.join(str(link.parent), target))
    return resolved == str(root) or resolved.startswith(str(root) + "/")


def _write_file(data: bytes | Path, target: Path) -> None:
    """Write a regular file at `target`; a symlink there is replaced, never written through (like tar)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    if isinstance(data, Path):
        shutil.copyfile(data, target)
    else:
        target.write_bytes(data)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip(".-") or "sandbox"
