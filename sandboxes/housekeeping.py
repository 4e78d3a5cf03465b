"""The file housekeeping around a rollout (log folders, the verifier's clean folders, is there a reward
file and how big), done as root through `exec`: how backends without direct access to the sandbox's
files (docker, e2b) implement the protocol's `make_dirs`, `reset_dir` and `stat_path`
(`HousekeepingByExec`). The local backend does the same on its host folders, without a process per
question."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel

from sandboxes.errors import SandboxError

HOUSEKEEPING_TIMEOUT_S = 60.0


class PathStat(BaseModel):
    """What stands at a path of a sandbox (symlinks followed, as `test -f` does)."""

    kind: Literal["file", "dir", "other"]
    size: int = 0
    """A file's bytes."""
    entries: int = 0
    """A folder's entries (hidden ones too)."""


# Empty the folder in place (it may be a mount point); a symlink or file planted there is removed itself,
# never followed.
_RESET = (
    'd="$1"; if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi; '
    'mkdir -p "$d" && find "$d" -mindepth 1 -delete'
)

# What stands at $1, as `stat_path` reports it (symlinks followed).
_STAT = (
    'p="$1"; if [ -d "$p" ]; then echo "dir $(ls -A "$p" | wc -l)"; '
    'elif [ -f "$p" ]; then echo "file $(stat -L -c %s "$p")"; elif [ -e "$p" ]; then echo other; fi'
)


class HousekeepingByExec:
    """`make_dirs`, `reset_dir` and `stat_path` for a sandbox class whose `exec` is all it has."""

    async def make_dirs(self, paths: list[str], *, mode: int = 0o777) -> None:
        quoted = " ".join(shlex.quote(p) for p in paths)
        result = await self.exec(
            ["sh", "-c", f"mkdir -p {quoted} && chmod {mode:o} {quoted}"],
            user="root",
            timeout_s=HOUSEKEEPING_TIMEOUT_S,
        )
        if not result.ok:
            raise SandboxError(
                f"could not make {', '.join(paths)}: {(result.stderr or result.stdout).strip()}"
            )

    async def reset_dir(self, path: str, *, mode: int | None = None) -> None:
        script = _RESET + (f' && chmod {mode:o} "$d"' if mode is not None else "")
        result = await self.exec(
            ["sh", "-c", script, "reset-dir", path], user="root", timeout_s=HOUSEKEEPING_TIMEOUT_S
        )
        if not result.ok:
            output = (result.stderr or result.stdout).strip()
            raise SandboxError(f"could not reset {path} (exit {result.exit_code}): {output}")

    async def stat_path(self, path: str) -> PathStat | None:
        result = await self.exec(
            ["sh", "-c", _STAT, "stat", path], user="root", timeout_s=HOUSEKEEPING_TIMEOUT_S
        )
        words = result.stdout.split()
        if not result.ok or not words:
            return None
        if words[0] == "dir":
            return PathStat(kind="dir", entries=int(words[1]))
        if words[0] == "file":
            return PathStat(kind="file", size=int(words[1]))
        return PathStat(kind="other")
