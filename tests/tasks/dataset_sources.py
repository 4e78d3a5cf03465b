"""Builders for the offline dataset sources the tests make: a git repository of task folders (reached by
a file:// URL, so the real git client clones and fetches it), a Harbor registry file naming its tasks,
and a pre-filled Hugging Face Hub cache in the layout huggingface_hub writes (blobs, snapshot links,
refs), so `snapshot_download` with HF_HUB_OFFLINE=1 finds it as it would after a real download."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from tasks import BUILTIN_DIR

HARBOR_TASK_TOML = """\
version = "1.0"
source = "a Harbor adapter"

[metadata]
difficulty_explanation = "Trivial task for demonstration"
category = "programming"
tags = ["trivial"]

[[metadata.authors]]
name = "Task Author"
email = "author@example.com"

[verifier]
timeout_sec = 120.0
env = { API_KEY = "sk-test-123" }

[agent]
timeout_sec = 120.0

[solution]
env = { API_KEY = "sk-test-123" }

[environment]
build_timeout_sec = 600.0
docker_image = "some-org/some-name:some-tag"
cpus = 1
memory_mb = 2048
storage_mb = 10240
gpus = 0
gpu_types = ["H100", "A100"]
allow_internet = true

[[environment.mcp_servers]]
name = "mcp-server"
transport = "streamable-http"
url = "http://mcp-server:8000/mcp"
"""
"""The example task.toml of Harbor's task-format page (laude-institute/harbor-docs,
content/docs/tasks/index.mdx), field for field."""

HARBOR_1_1_TASK_TOML = """\
schema_version = "1.1"
artifacts = []

[task]
name = "terminal-bench/extract-elf"
description = "Evaluates ability to parse ELF binary format and extract memory values."
keywords = ["file-operations"]
[[task.authors]]
name = "Task Author"
email = "author@example.com"

[metadata]
difficulty = "medium"
category = "file-operations"
tags = []
expert_time_estimate_min = 30.0
junior_time_estimate_min = 240.0

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
docker_image = "alexgshaw/extract-elf:20251031"
cpus = 1
memory_mb = 2048
storage_mb = 10240
gpus = 0
allow_internet = true
mcp_servers = []

[verifier.env]

[environment.env]

[solution.env]
"""
"""A terminal-bench 2 task.toml as Harbor's registry serves it today (schema 1.1, `[task]` with an
`org/name`, authors and keywords, empty env tables), field for field."""

_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **_GIT_ENV})  # fmt: skip
    return done.stdout.strip()


def builtin_tasks_repo(root: Path, names: list[str], *, under: str = "tasks") -> tuple[str, str]:
    """A git repository holding copies of built-in tasks under `under/`; (file:// URL, commit id)."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    for name in names:
        shutil.copytree(BUILTIN_DIR / name, root / under / name)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "tasks")
    return root.absolute().as_uri(), git(root, "rev-parse", "HEAD")


def registry_entry(name: str, version: str, tasks: list[dict]) -> dict:
    return {"name": name, "version": version, "description": f"{name} for the tests", "tasks": tasks}


def write_registry(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps(entries, indent=2))
    return path


def prefill_hub_cache(hub_cache: Path, repo: str, source: Path, *, prefix: str = "") -> str:
    """Every file under `source` as the snapshot of dataset `repo` at a made-up commit, stored the way
    huggingface_hub stores a download: content in `blobs/<sha256>`, the snapshot a tree of relative
    symlinks to the blobs, `refs/main` naming the commit. Returns the commit id."""
    storage = hub_cache / f"datasets--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = storage / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / prefix / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return commit
