# ruff: noqa: F811  (the Docker fixtures are imported from tests.sandboxes.conftest and used by name)
"""Fixtures for the task tests: task folders written per test, and the real `local` / `docker` backends."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

# One home for the Docker fixtures: the sandbox tests' conftest.
from tests.sandboxes.conftest import BASE_IMAGE, REPO, base_image, docker_client  # noqa: E402,F401

TASK_TOML = """\
schema_version = "1.0"

[task]
name = "test/tiny"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 60.0

[environment]
memory_mb = 512
"""
DOCKERFILE = f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY start.txt /app/start.txt\n"
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"

TaskFactory = Callable[..., Path]


@pytest.fixture
def make_task(tmp_path) -> TaskFactory:
    """Write a valid task folder; `files` adds or replaces files (None deletes one)."""

    def make(name: str = "tiny", files: dict[str, str | None] | None = None) -> Path:
        root = tmp_path / "tasks" / name
        defaults: dict[str, str | None] = {
            "instruction.md": "Do the tiny thing.\n",
            "task.toml": TASK_TOML,
            "environment/Dockerfile": DOCKERFILE,
            "environment/start.txt": "start\n",
            "tests/test.sh": TEST_SH,
            "solution/solve.sh": "#!/bin/bash\ntrue\n",
        }
        defaults.update(files or {})
        for rel, text in defaults.items():
            if text is None:
                continue
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return root

    return make


@pytest.fixture(scope="session")
def no_leftover_containers(docker_client):
    """At the end of the session no sandbox container this process started may survive."""
    from sandboxes.docker import OWNER_LABEL, owner_id

    yield
    left = docker_client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_id()}"})
    names = [c.name for c in left]
    for container in left:
        container.remove(force=True)
    assert not names, f"sandbox containers left behind: {names}"


@pytest.fixture
def local_backend(tmp_path):
    from sandboxes.local import LocalBackend

    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local backend's task paths need it")
    return LocalBackend(root=tmp_path / "sandboxes", isolation="bwrap")


@pytest.fixture
async def docker_backend(docker_client, base_image, no_leftover_containers):
    from sandboxes.docker import DockerBackend

    backend = DockerBackend()
    yield backend
    await backend.aclose()


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    """The same verifier tests run against every backend that can run here."""
    return request.getfixturevalue(f"{request.param}_backend")
