"""Collect a task's `artifacts` from its sandbox into the rollout's folder, as Harbor does.

Harbor (harbor/trial/artifact_handler.py, 0.26): after the agent and before the verifier, every entry
of the task's `artifacts` (a step's too) is copied out of the sandbox, with the convention folder
`/logs/artifacts` always first. A destination goes to `artifacts/<destination>`; without one the
absolute source is mirrored (`/var/log/x` -> `artifacts/var/log/x`). A missing source is recorded as
"failed" and never fails the run; when two entries claim one path, the first wins. `manifest.json`
lists each entry: source, destination, type (file | directory), status (ok | empty | failed |
skipped), service and exclude.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
from pathlib import Path, PurePosixPath

from sandboxes.base import Sandbox
from sandboxes.errors import SandboxError
from tasks.models import ArtifactConfig, artifact_entries

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def _relative(source: str) -> PurePosixPath:
    parts = [part for part in PurePosixPath(source).parts if part not in ("", "/", "..")]
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


async def collect_artifacts(
    sandbox: Sandbox, entries: list[str | ArtifactConfig], folder: Path
) -> list[dict]:
    """Copy each entry out of `sandbox` into `folder` (the rollout's `artifacts/`) and write its manifest.
    Returns the manifest's entries; nothing here raises for a missing or unreadable source."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest: list[dict] = []
    claimed: list[PurePosixPath] = []
    for entry in artifact_entries(entries):
        output = _relative(entry.destination or entry.source)
        record = {
            "source": entry.source,
            "destination": f"artifacts/{output}",
            "type": "file",
            "status": "ok",
            "service": entry.service,
            "exclude": list(entry.exclude),
        }
        if any(output == p or p in output.parents or output in p.parents for p in claimed):
            record["status"] = "skipped"  # another entry already claims this path: the first wins
            log.warning("artifact %s overlaps an earlier entry's %s; skipped", entry.source, output)
        else:
            claimed.append(output)
            await _copy(sandbox, entry, folder / output, record)
        manifest.append(record)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


async def _copy(sandbox: Sandbox, entry: ArtifactConfig, target: Path, record: dict) -> None:
    try:
        found = await sandbox.stat_path(entry.source)
        if found is not None and found.kind == "dir":
            record["type"] = "directory"
            await sandbox.download_dir(entry.source, target)
            _drop_excluded(target, entry.exclude)
            if not any(target.iterdir()):
                record["status"] = "empty"
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(await sandbox.download_file(entry.source))
    except (SandboxError, OSError) as exc:
        record["status"] = "failed"
        log.debug("artifact %s not collected: %s", entry.source, exc)
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()


def _drop_excluded(folder: Path, patterns: list[str]) -> None:
    """tar --exclude semantics, near enough: a pattern matches a path's name or its relative path."""
    if not patterns:
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        rel = path.relative_to(folder).as_posix()
        if any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(rel, p) for p in patterns):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
