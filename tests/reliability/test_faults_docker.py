"""Docker faults: a sandbox container removed from outside mid-rollout, and no Docker daemon at start-up.

The real Docker engine and a real `harbor serve` (in a thread for the first test, a process for the
second); the agent is the `sleeper` test harness of tests/server/scripted.py, which runs `sleep` in
its sandbox, so the container is busy when it is removed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from harbor_server.client import HarborSessionFactory
from harbor_server.embedded import free_port
from tests.reliability.conftest import REPO, wait_for
from tests.sandboxes.conftest import BASE_IMAGE, docker_client_or_skip
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server
from tests.server.scripted import SERVER_KWARGS

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def docker_client():
    client = docker_client_or_skip()
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"base image {BASE_IMAGE} missing: build it with docker/sandbox-base/build.sh")
    return client


@pytest.mark.docker
def test_container_removed_mid_rollout_fails_it_cleanly(docker_client, tmp_path, sandbox_root):
    from sandboxes.docker import NAME_LABEL

    config = make_config(tmp_path, sandbox="docker", capture_host="0.0.0.0")
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(server.url, split="builtin", harness="sleeper", llm_url=UNUSED_ENGINE, model="tiny") as factory,
    ):  # fmt: skip
        session = factory.create("fix-pagination", episode_id="removed")
        name = f"harbor-{session.rollout_id[:16]}"
        wait_for(lambda: factory.client.rollout(session.rollout_id).phase == "agent", 300, "the agent phase")
        [container] = docker_client.containers.list(filters={"label": f"{NAME_LABEL}={name}"})
        wait_for(lambda: "313.25" in str(container.top().get("Processes")), 60, "the agent's sleep")
        subprocess.run(["docker", "rm", "-f", container.id], check=True, capture_output=True, timeout=60)

        result = session.wait_for_completion(timeout_s=120)
        assert result.status == "failed" and result.env_reward is None, result.model_dump_json()
        # Whichever step meets the missing container first (usually the verifier) names it.
        assert name in result.error and "not running" in result.error, result.error
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        # The server lives on: the next rollout on Docker runs and is scored.
        with HarborSessionFactory(
            server.url, split="builtin", harness="oracle", llm_url=UNUSED_ENGINE, model="tiny"
        ) as oracle:
            assert oracle.create("fix-pagination").wait_for_completion(timeout_s=300).env_reward == 1.0
    assert docker_client.containers.list(all=True, filters={"label": f"{NAME_LABEL}={name}"}) == []


def test_no_docker_daemon_at_start_up_is_named(tmp_path):
    """`harbor serve --sandbox docker` with DOCKER_HOST on a dead socket: it says so at start-up, /info
    reports the backend down with the cause, and a rollout on it fails with that cause (not a hang)."""
    dead = tmp_path / "no-docker.sock"
    port = free_port()
    env = os.environ | {
        "DOCKER_HOST": f"unix://{dead}",
        "HARBOR_RUNS_DIR": str(tmp_path / "runs"),
        "COLUMNS": "200",
    }
    args = [
        sys.executable, "-m", "tests.reliability.serve_with_callers", "serve", "--sandbox", "docker",
        "--port", str(port), "--capture-port", str(free_port()), "--capture-host", "127.0.0.1",
        "--skip-engine-check", "--store", f"sqlite:///{tmp_path}/traces.db",
    ]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _up(url), 120, "harbor serve to start")
        output = log_path.read_text()
        assert proc.poll() is None, output
        assert "the default sandbox 'docker' is not ready" in output
        [docker] = [
            s for s in httpx.get(url + "/info", timeout=30).json()["sandboxes"] if s["name"] == "docker"
        ]
        assert docker["healthy"] is False
        assert f"cannot reach the Docker engine at unix://{dead}" in docker["detail"]
        assert "Start dockerd (or set DOCKER_HOST)" in docker["detail"]
        with HarborSessionFactory(
            url, split="builtin", harness="nop", llm_url=UNUSED_ENGINE, model="tiny"
        ) as factory:
            result = factory.create(0).wait_for_completion(timeout_s=120)
        assert result.status == "failed" and result.env_reward is None
        assert "Docker engine" in result.error and str(dead) in result.error, result.error
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
