"""Where downloaded and materialised datasets live: `$HARBOR_CACHE_DIR` or `~/.cache/harbor-rl`.

Every download is written to a temporary folder beside its target and renamed into place, so a
folder that exists is complete (a crash mid-download leaves only a `.tmp-*` folder, never half a task).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root(cache_dir: Path | None = None) -> Path:
    """`cache_dir` when given, else `$HARBOR_CACHE_DIR`, else `~/.cache/harbor-rl`."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("HARBOR_CACHE_DIR") or Path.home() / ".cache" / "harbor-rl")


def fill_once(target: Path, fill: Callable[[Path], None]) -> Path:
    """`target`, written by `fill(tmp)` into a fresh folder renamed into place unless it exists already."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        fill(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # another process renamed its copy first: theirs is as good
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
