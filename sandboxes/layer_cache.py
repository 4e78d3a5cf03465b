"""What a harness layer wrote into a local sandbox, kept so the next sandbox copies it instead of
installing again (a pip install of mini-swe-agent costs 30-60 s; the copy well under a second).

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


def restore(entry: Path, fs: Path) -> None:
    # cp -a keeps modes, symlinks and owners, and copies (never links): the agent may change these
    # files, and the cache must not change with them.
    subprocess.run(["cp", "-a", f"{entry / 'fs'}/.", f"{fs}/"], check=True, capture_output=True)
