"""The stand-in base images (docker/stand-ins): a task written for the public image builds and verifies
unedited, and build.sh never puts a stand-in over a real image."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from sandboxes import SandboxSpec

from .conftest import REPO, write_env

pytestmark = pytest.mark.docker
BUILD = REPO / "docker" / "stand-ins" / "build.sh"


def run_build(images_file=None) -> str:
    env = None
    if images_file is not None:
        import os

        env = {**os.environ, "HARBOR_STAND_IN_IMAGES": str(images_file)}
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def stand_ins(docker_client, base_image):
    run_build()


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_an_ubuntu_task_installs_with_apt_and_pip_and_verifies_with_uvx(
    docker_backend, stand_ins, tmp_path
):
    """What Harbor's template task does: apt-get and pip at build time, `uvx --with pytest` in test.sh."""
    env_dir = write_env(
        tmp_path / "environment",
        "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y curl\nRUN pip install flask\nWORKDIR /app\n",
    )
    sandbox = await docker_backend.start(
        SandboxSpec(name="stand-in", environment_dir=env_dir, network_mode="public")
    )
    try:
        assert (await sandbox.exec("python -c 'import flask; print(flask.__name__)'")).stdout == "flask\n"
        verify = await sandbox.exec("uvx --with pytest==8.4.1 pytest --version", timeout_s=240)
        assert verify.ok, verify.stderr
        assert "pytest 8.4.1" in verify.stdout + verify.stderr
    finally:
        await sandbox.stop()


def test_build_sh_tags_missing_names_only_never_over_a_real_image(docker_client, base_image, tmp_path):
    tag = uuid.uuid4().hex[:8]
    real, missing = f"harbor-rl-test/real-{tag}:1", f"harbor-rl-test/missing-{tag}:1"
    # A "real" image: anything without our label.
    subprocess.run(["docker", "tag", base_image, real], check=True)
    images = tmp_path / "images.txt"
    images.write_text(f"# test list\n{real}  bookworm\n{missing}  bookworm\n")
    try:
        first = run_build(images)
        assert f"{real} is a real image here; kept" in first
        assert f"tagged {missing} -> harbor-rl/stand-in:bookworm-" in first
        assert docker_client.images.get(real).id == docker_client.images.get(base_image).id
        assert docker_client.images.get(missing).labels.get("harbor-rl.stand-in") == "bookworm"
        again = run_build(images)
        assert "tagged" not in again, "a second run changes nothing"
    finally:
        for name in (real, missing):
            subprocess.run(["docker", "rmi", name], capture_output=True)
