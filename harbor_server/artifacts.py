"""Collect a task's `artifacts` from its sandbox into the rollout's folder, as Harbor does.

Harbor (harbor/trial/artifact_handler.py, 0.26): after the agent and before the verifier, every entry
of the task's `artifacts` (a step's too) is copied out of the sandbox, with the convention folder
`/logs/artifacts` always first. A destination goes to `artifacts/<destination>`; without one the
absolute source is mirrored (`/var/log/x` -> `artifacts/var/log/x`). A missing source is recorded as
"failed" and never fails the run; when two entries claim one path, the first wins (silently where the
first already holds the later one at the same place, e.g. DeepSWE's `/logs/artifacts/model.patch` under the
convention folder; with a warning otherwise). `manifest.json`
lists each entry: source, destination, type (file | directory), status (ok | empty | failed |
skipped), service and exclude.

Collection runs in passes (Harbor's `_collect_artifacts_phased`): the main service's entries, then the
sidecars' (`services`); a later pass adds to the manifest and keeps the earlier claims. For a separate
verifier, `upload_artifacts` puts what was collected back at each entry's `source` path in the
verifier's own sandbox (Harbor's `ArtifactHandler.upload_artifacts`).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandboxes.base import Sandbox
from sandboxes.errors import SandboxError
from tasks.models import ARTIFACTS_CONVENTION_DIR, MAIN_SERVICE, ArtifactConfig, artifact_entries

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def _relative(source: str) -> PurePosixPath:
    parts = [part for part in PurePosixPath(source).parts if part not in ("", "/", "..")]
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


@dataclass(frozen=True)
class _Claim:
    """An entry that got its output path: a later entry overlapping it is skipped."""

    source: str
    output: PurePosixPath
    service: str
    exclude: tuple[str, ...]

    def overlaps(self, output: PurePosixPath) -> bool:
        return output == self.output or self.output in output.parents or output in self.output.parents

    def covers(self, later: _Claim) -> bool:
        """Whether this claim already holds `later`'s source at `later`'s output path, so skipping it loses
        nothing (Harbor's `artifact_is_covered_by`, harbor/models/task/artifacts.py 0.26)."""
        source, mine = PurePosixPath(later.source), PurePosixPath(self.source)
        if later.service != self.service or not source.is_relative_to(mine):
            return False
        if source == mine and later.output == self.output:
            return later.exclude == self.exclude
        return not self.exclude and later.output == self.output / source.relative_to(mine)


ServiceSandbox = Callable[[str], Awaitable[Sandbox]]
"""A compose service's sandbox by name ("main": the agent's own)."""


async def collect_artifacts(
    sandbox: Sandbox,
    entries: list[str | ArtifactConfig],
    folder: Path,
    *,
    services: set[str] | None = None,
    service_sandbox: ServiceSandbox | None = None,
) -> list[dict]:
    """Copy each entry out of `sandbox` into `folder` (the rollout's `artifacts/`) and write its manifest.
    `services`: only the entries of these services (a pass), added to the manifest an earlier pass
    wrote; `service_sandbox` finds a sidecar's. Returns the manifest's entries; nothing here raises
    for a missing or unreadable source."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest: list[dict] = []
    if services is not None and (folder / MANIFEST).is_file():
        manifest = json.loads((folder / MANIFEST).read_text())
    claimed = [
        _Claim(
            r["source"],
            PurePosixPath(r["destination"]).relative_to("artifacts"),
            r["service"] or MAIN_SERVICE,
            tuple(r["exclude"]),
        )
        for r in manifest
        if r["status"] != "skipped"
    ]
    for entry in artifact_entries(entries):
        service = entry.service or MAIN_SERVICE
        if services is not None and service not in services:
            continue
        output = _relative(entry.destination or entry.source)
        record = {
            "source": entry.source,
            "destination": f"artifacts/{output}",
            "type": "file",
            "status": "ok",
            "service": entry.service,
            "exclude": list(entry.exclude),
        }
        claim = _Claim(entry.source, output, service, tuple(entry.exclude))
        prior = next((c for c in claimed if c.overlaps(output)), None)
        if prior is not None:
            record["status"] = "skipped"  # another entry already claims this path: the first wins
            if not prior.covers(claim):
                log.warning("artifact %s overlaps an earlier entry's %s; skipped", entry.source, prior.output)
        else:
            claimed.append(claim)
            source = sandbox
            if service != MAIN_SERVICE:
                try:
                    if service_sandbox is None:
                        raise SandboxError(f"service {service!r}: the sandbox runs no compose services")
                    source = await service_sandbox(service)
                except SandboxError as exc:
                    record["status"] = "failed"
                    log.warning("artifact %s of service %s not collected: %s", entry.source, service, exc)
                    manifest.append(record)
                    continue
            await _copy(source, entry, folder / output, record)
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


async def upload_artifacts(sandbox: Sandbox, entries: list[str | ArtifactConfig], folder: Path) -> int:
    """Put what `collect_artifacts` copied into `folder` back into `sandbox` (a separate verifier's), each
    entry at its own `source` path, the convention folder at /logs/artifacts (Harbor's
    `upload_artifacts`: a folder replaces what is there, a file's parents are made). Entries that were
    not collected are left out. Returns how many were uploaded."""
    records = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).is_file() else []
    usable = {(r["source"], r["service"]) for r in records if r["status"] in ("ok", "empty")}
    uploaded = 0
    for entry in artifact_entries(entries):
        if (entry.source, entry.service) not in usable:
            continue
        local = folder / _relative(entry.destination or entry.source)
        target = ARTIFACTS_CONVENTION_DIR if entry.source.rstrip("/") == ARTIFACTS_CONVENTION_DIR else entry.source
        if local.is_dir():
            await sandbox.reset_dir(target, mode=0o777)
            await sandbox.upload_dir(local, target)
        elif local.is_file():
            made = await sandbox.exec(["mkdir", "-p", str(PurePosixPath(target).parent)], user="root")
            if not made.ok:
                raise SandboxError(f"could not make the folder of {target}: {made.stderr.strip()}")
            await sandbox.upload_file(local, target)
        else:
            continue
        uploaded += 1
    return uploaded
