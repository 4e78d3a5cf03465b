"""Fixtures for the sandbox tests: backends against the real bwrap / Docker engine, the base image."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "harbor-rl/sandbox-base:bookworm"


def docker_client_or_skip():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no daemon"
        pytest.skip(f"Docker engine not reachable: {exc}")
    return client


@pytest.fixture(scope="session")
def docker_client():
    return docker_client_or_skip()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """Build the offline base image once per session if it is missing (about a minute)."""
    try:
        docker_client.images.get(BASE_IMAGE)
    except Exception:
        subprocess.run(["bash", str(REPO / "docker" / "sandbox-base" / "build.sh")], check=True, timeout=900)
    return BASE_IMAGE


@pytest.fixture(scope="session")
def no_leftover_containers(docker_client):
    """Assert at the end of the session that no sandbox container this test process made survived.

    Only this process's containers count (label harbor-rl.owner=<pid>@<host>): other test runs may
    share the engine."""
    from sandboxes.docker import OWNER_LABEL, owner_id

    yield
    mine = {"label": ["harbor-rl.sandbox=1", f"{OWNER_LABEL}={owner_id()}"]}
    left = docker_client.containers.list(all=True, filters=mine)
    names = [c.name for c in left]
    for container in left:
        container.remove(force=True)
    assert not names, f"sandbox containers left behind: {names}"
    # Leave no networks or firewall chains behind either (unless another run still uses them).
    import asyncio

    from sandboxes.docker import DockerBackend

    asyncio.run(DockerBackend().teardown())


@pytest.fixture
def local_backend(tmp_path):
    from sandboxes.local import LocalBackend

    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local tests check its isolation")
    return LocalBackend(root=tmp_path / "sandboxes", isolation="bwrap")


@pytest.fixture
def host_secrets(monkeypatch):
    """Plant the host secrets a sandbox must never see."""
    secrets = {"E2B_API_KEY": "e2b-secret-123", "HF_TOKEN": "hf-secret-456", "HARBOR_ADMIN_KEY": "admin-789"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    return secrets


def write_env(folder: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    """Create a task `environment/` folder with a Dockerfile and context files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


@pytest.fixture
async def docker_backend(docker_client, base_image, no_leftover_containers):
    from sandboxes.docker import DockerBackend

    backend = DockerBackend()
    yield backend
    await backend.aclose()


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    """The same protocol tests run against every backend that can run here."""
    return request.getfixturevalue(f"{request.param}_backend")
