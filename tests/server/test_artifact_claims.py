"""Overlapping `artifacts` entries as Harbor 0.26 treats them (harbor/trial/artifact_handler.py
`_download_artifact`, harbor/models/task/artifacts.py `artifact_is_covered_by`): the first claim wins; a later
entry the first one already holds at the same place is skipped silently (every DeepSWE task lists
`/logs/artifacts/model.patch`, which the convention folder already collects), a real collision with a
warning. A real local sandbox (bubblewrap)."""

from __future__ import annotations

import json
import logging
import shutil
import uuid

import pytest

from harbor_server.artifacts import collect_artifacts
from sandboxes import SandboxSpec
from sandboxes.local import LocalBackend
from tasks.models import ArtifactConfig

pytestmark = pytest.mark.timeout(120)


async def test_an_entry_the_first_claim_covers_is_skipped_silently_a_collision_with_a_warning(
    tmp_path, caplog
):
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local sandbox needs it")
    env_dir = tmp_path / "environment"
    env_dir.mkdir()
    (env_dir / "Dockerfile").write_text("FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\n")
    backend = LocalBackend(root=tmp_path / "sandboxes", isolation="bwrap")
    sandbox = await backend.start(SandboxSpec(name=f"claims-{uuid.uuid4().hex[:8]}", environment_dir=env_dir))
    try:
        await sandbox.make_dirs(["/logs/artifacts"], mode=0o777)
        made = await sandbox.exec(
            "echo diff > /logs/artifacts/model.patch && mkdir -p /app/out && echo a > /app/out/a.txt"
            " && echo b > /app/b.txt"
        )
        assert made.ok, made.stderr
        entries = [
            "/logs/artifacts/model.patch",  # inside the convention folder, at its own place there: covered
            "/app/out",
            "/app/out/a.txt",  # covered by /app/out
            ArtifactConfig(source="/app/b.txt", destination="app/out/a.txt"),  # another file, same path
        ]
        with caplog.at_level(logging.WARNING, logger="harbor_server.artifacts"):
            manifest = await collect_artifacts(sandbox, entries, tmp_path / "artifacts")
    finally:
        await sandbox.stop()
    status = {(r["source"], r["destination"]): r["status"] for r in manifest}
    assert status == {
        ("/logs/artifacts", "artifacts/logs/artifacts"): "ok",
        ("/logs/artifacts/model.patch", "artifacts/logs/artifacts/model.patch"): "skipped",
        ("/app/out", "artifacts/app/out"): "ok",
        ("/app/out/a.txt", "artifacts/app/out/a.txt"): "skipped",
        ("/app/b.txt", "artifacts/app/out/a.txt"): "skipped",
    }
    assert json.loads((tmp_path / "artifacts" / "manifest.json").read_text()) == manifest
    # The first claim's copies are what was kept: nothing of the skipped entries overwrote them.
    assert (tmp_path / "artifacts" / "logs" / "artifacts" / "model.patch").read_text() == "diff\n"
    assert (tmp_path / "artifacts" / "app" / "out" / "a.txt").read_text() == "a\n"
    warned = [r.getMessage() for r in caplog.records if r.name == "harbor_server.artifacts"]
    assert warned == ["artifact /app/b.txt overlaps an earlier entry's app/out; skipped"]
