"""Pinned harness packages fetched ON THE HOST into a cache, so sandbox images build offline.

Sandboxes often cannot reach package registries (no network, or a TLS-intercepting firewall whose CA
they do not trust), so harnesses never install from the network inside the image. Instead the host
runs `pip download` / `npm pack` once per pinned version into
`$HARBOR_CACHE_DIR/harness-assets/<name>-<version>/` (default cache `~/.cache/harbor-rl`; or `$HARBOR_HARNESS_ASSETS`), and the
harness's image layer COPYs that folder in. A folder is complete only once `.complete` exists; it is
filled under a file lock in a temporary folder and renamed, so concurrent rollouts and crashed fetches
never see half a download.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from harnesses.errors import HarnessAssetError

ASSETS_ENV = "HARBOR_HARNESS_ASSETS"
COMPLETE_MARKER = ".complete"
FETCH_TIMEOUT_S = 900.0

# manylinux tags up to glibc 2.36 (Debian bookworm, the sandbox base). pip before 24 does not expand a
# manylinux_2_X tag to the older ones it implies, so they are listed.
_MANYLINUX = ["manylinux1", "manylinux2010", "manylinux2014"] + [f"manylinux_2_{i}" for i in range(17, 37)]


def assets_root() -> Path:
    """Where fetched harness packages are cached."""
    configured = os.environ.get(ASSETS_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("HARBOR_CACHE_DIR") or Path.home() / ".cache" / "harbor-rl") / "harness-assets"


def ensure_asset(key: str, fill: Callable[[Path], None]) -> Path:
    """The complete cache folder `<root>/<key>`, filled by `fill(tmp_folder)` the first time."""
    root = assets_root()
    final = root / key
    if (final / COMPLETE_MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{key}.lock"):
        if (final / COMPLETE_MARKER).is_file():  # another process filled it while we waited
            return final
        partial = root / f".{key}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            fill(partial)
            (partial / COMPLETE_MARKER).write_text("")
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return final


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def linux_machine() -> str:
    """`x86_64` or `aarch64`: the architecture of the host, and so of the containers it runs."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    raise HarnessAssetError(
        f"unsupported CPU architecture {machine!r} for sandbox images (x86_64 or aarch64)"
    )


def pip_download(requirements: Sequence[str], dest: Path, *, python_version: str = "3.11") -> None:
    """Binary wheels for `requirements` and all their dependencies, for CPython `python_version` on Linux."""
    machine = linux_machine()
    platforms = [arg for tag in _MANYLINUX for arg in ("--platform", f"{tag}_{machine}")]
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        "--dest", str(dest), "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version, *platforms, *requirements,
    ]  # fmt: skip
    _run(command, what=f"pip download {' '.join(requirements)}")


def npm_pack(spec: str, dest: Path) -> Path:
    """Download the npm tarball for `spec` (`name@version`) into `dest`; returns its path."""
    if shutil.which("npm") is None:
        raise HarnessAssetError(f"npm is not installed on this host, so {spec} cannot be fetched")
    before = set(dest.glob("*.tgz"))
    _run(["npm", "pack", "--silent", "--pack-destination", str(dest), spec], what=f"npm pack {spec}")
    created = sorted(set(dest.glob("*.tgz")) - before)
    if len(created) != 1:
        raise HarnessAssetError(f"npm pack {spec} produced {len(created)} tarballs in {dest}, expected 1")
    return created[0]


def extract_member(tarball: Path, member: str, target: Path) -> Path:
    """Extract one file of a tarball (e.g. `package/bin/opencode`) to `target`, keeping its mode."""
    with tarfile.open(tarball) as archive:
        try:
            info = archive.getmember(member)
        except KeyError:
            raise HarnessAssetError(f"{tarball} has no {member}") from None
        source = archive.extractfile(info)
        if source is None:
            raise HarnessAssetError(f"{tarball}: {member} is not a regular file")
        target.parent.mkdir(parents=True, exist_ok=True)
        with source, target.open("wb") as out:
            shutil.copyfileobj(source, out)
    target.chmod(info.mode | 0o755)
    return target


def _run(command: list[str], *, what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise HarnessAssetError(f"{what} took longer than {FETCH_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        output = "\n".join(
            line for line in (done.stderr + done.stdout).splitlines() if "is ignored" not in line
        )
        raise HarnessAssetError(f"{what} failed (exit {done.returncode}):\n{output[-2000:]}")


def npm_files(spec: str, folder: Path, members: dict[str, str]) -> None:
    """Fetch the npm package `spec` and keep some of its files (e.g. an agent's executable), each
    member as `folder/<name>` (`{member: name}`); the tarball itself is not kept."""
    tarball = npm_pack(spec, folder)
    try:
        for member, name in members.items():
            extract_member(tarball, member, folder / name)
    finally:
        tarball.unlink()


def unpack(tarball: Path, folder: Path) -> None:
    """Extract a whole npm tarball into `folder` (its files under `package/`), refusing members that
    would land outside it or are links or devices (tarfile's `data` filter)."""
    with tarfile.open(tarball) as archive:
        archive.extractall(folder, filter="data")
