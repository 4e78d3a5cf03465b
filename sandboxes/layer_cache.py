"""What a harness layer wrote into a local sandbox, kept so the next sandbox reuses it instead of
installing again (a pip install of mini-swe-agent costs 30-60 s).

Reuse binds, it does not copy: every folder the layer created whole (mini-swe-agent's 700 MB
virtualenv under /opt) is bound read-only from the cache into the next sandboxes, so starting and
removing a sandbox costs no copy (copying it took 15 s and removing it 50 s on a busy machine); the
agent can run those files but not change them, so no rollout alters what later ones get. The few files
a layer writes into folders that already existed are copied.

A layer's files are the difference of the sandbox's folder before and after its instructions ran;
its ENV, WORKDIR and USER lines are cheap and are replayed instead. The key is the layer's
instructions and the names and sizes of its build context, so a new version is a new entry.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from sandboxes.base import ImageLayer

Snapshot = dict[str, tuple[int, int]]
"""Relative path -> (mtime_ns, size) of every file and symlink under a sandbox's folder."""

_DONE = "complete"


def layer_key(layer: ImageLayer) -> str:
    digest = hashlib.sha256(layer.name.encode())
    for line in layer.dockerfile_lines:
        digest.update(b"\0" + line.encode())
    if layer.context_dir is not None:
        root = Path(layer.context_dir)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(f"\0{path.relative_to(root)}:{path.stat().st_size}".encode())
    return f"{layer.name}-{digest.hexdigest()[:16]}"


def snapshot(fs: Path) -> Snapshot:
    found: Snapshot = {}
    for folder, dirs, files in os.walk(fs):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            found[os.path.relpath(path, fs)] = (info.st_mtime_ns, info.st_size)
    return found


def lookup(cache_root: Path, key: str) -> Path | None:
    entry = cache_root / key
    return entry if (entry / _DONE).exists() else None


def save(fs: Path, before: Snapshot, cache_root: Path, key: str) -> None:
    """Copy what changed under `fs` since `before` into the cache; a concurrent save of the same key
    is harmless (the first complete entry stays)."""
    after = snapshot(fs)
    staging = cache_root / f".{key}-{uuid.uuid4().hex[:8]}"
    files = staging / "fs"
    files.mkdir(parents=True)
    for relative, stamp in after.items():
        if before.get(relative) == stamp:
            continue
        source, target = fs / relative, files / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    (staging / _DONE).touch()
    try:
        staging.rename(cache_root / key)
    except OSError:  # another sandbox saved it first
        shutil.rmtree(staging, ignore_errors=True)


def restore(entry: Path, fs: Path, *, copy_under: frozenset[str]) -> list[tuple[Path, str]]:
    """Put the layer of `entry` into the sandbox folder `fs`; returns the (cached folder, sandbox path)
    pairs to bind read-only: the folders the layer created whole. The rest is copied, and so is all
    it wrote under the top-level folders `copy_under` (/root, /tmp, the workdir: the agent's to write)."""
    binds: list[tuple[Path, str]] = []
    _restore_into(entry / "fs", fs, "", binds, copy_under)
    return binds


def copy_all(entry: Path, fs: Path) -> None:
    """The whole layer copied into `fs` (a sandbox without bwrap has no binds)."""
    _copy(entry / "fs", fs)


def _restore_into(
    cached: Path, fs: Path, relative: str, binds: list[tuple[Path, str]], copy_under: frozenset[str]
) -> None:
    for item in sorted(cached.iterdir()):
        rel = f"{relative}/{item.name}"
        target = fs / rel.lstrip("/")
        if not item.is_dir() or item.is_symlink() or (not relative and item.name in copy_under):
            _copy(item, target)
        elif not target.exists() and not target.is_symlink():
            binds.append((item, rel))
        elif target.is_dir() and not target.is_symlink():
            _restore_into(item, fs, rel, binds, copy_under)


def _copy(source: Path, target: Path) -> None:
    # cp -a keeps modes, symlinks and owners, and copies (never links): the agent may change these
    # files, and the cache must not change with them. `dir/.` merges a folder into an existing one.
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir() and not source.is_symlink():
        target.mkdir(exist_ok=True)
        args = [f"{source}/.", f"{target}/"]
    else:
        args = [str(source), str(target)]
    subprocess.run(["cp", "-a", *args], check=True, capture_output=True)
