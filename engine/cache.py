"""Where the engine builds the models it makes itself (`tiny`, `smollm2-135m`, converted GGUF files),
and how: once, atomically, rebuilt only when the recipe's fingerprint changes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelBuildError


def default_cache_dir() -> Path:
    """`$HARBOR_CACHE_DIR` or `~/.cache/harbor-rl`."""
    return Path(os.environ.get("HARBOR_CACHE_DIR") or Path.home() / ".cache" / "harbor-rl")


def is_current(folder: Path, manifest: str, fingerprint: str) -> bool:
    """Whether `folder`'s manifest file records `fingerprint` (a folder without one is not current)."""
    try:
        return json.loads((folder / manifest).read_text())["fingerprint"] == fingerprint
    except (OSError, ValueError, KeyError):
        return False


def build_once(folder: Path, current: Callable[[], bool], make: Callable[[Path], None], force: bool, what: str) -> Path:
    """`folder`, made by `make(staging)` in a temporary folder renamed into place under a file lock unless
    `current()` already holds, so two processes asking at once get one build and never see a half-written
    folder. An OSError is ModelBuildError naming `what`."""
    if not force and current():
        return folder
    root = folder.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not force and current():
                return folder
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
            try:
                staging.chmod(0o755)  # mkdtemp's 0700 would keep other users (a vLLM container) out
                make(staging)
                if folder.exists():
                    shutil.rmtree(folder)
                staging.rename(folder)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(staging)
    except OSError as exc:
        raise ModelBuildError(f"cannot build {what} in {folder}: {exc}") from exc
    return folder
