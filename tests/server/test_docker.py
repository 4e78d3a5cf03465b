"""Rollouts through a real `harbor serve` on the real Docker engine: oracle 1.0, nop 0.0, and an
agent inside a container reaching the capture port with its session key (the engine is
`engine.imitation`'s vLLM imitation; vLLM needs a GPU)."""

from __future__ import annotations

import subprocess

import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from harbor_server.config import ServeConfig
from tests.sandboxes.conftest import BASE_IMAGE, docker_client_or_skip
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server
from tests.server.scripted import SERVER_KWARGS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]
MODEL = "imitation-model"


@pytest.fixture(scope="module")
def docker_ready():
    client = docker_client_or_skip()
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"base image {BASE_IMAGE} missing: build it with docker/sandbox-base/build.sh")


@pytest.fixture
def engine_url():
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as url:
        yield url + "/v1"


def test_oracle_and_nop_in_docker(docker_ready, tmp_path, sandbox_root):
    config = make_config(tmp_path, sandbox="docker", capture_host="0.0.0.0")
    with running_server(config) as server:
        for harness, expected in (("oracle", 1.0), ("nop", 0.0)):
            with HarborSessionFactory(
                server.url, split="builtin", harness=harness, llm_url=UNUSED_ENGINE, model="tiny"
            ) as factory:
                session = factory.create("fix-pagination", episode_id=harness)
                result = session.wait_for_completion(timeout_s=500)
                assert result.sandbox == "docker"
                assert result.status == "completed", result.error
                assert result.env_reward == expected


def _host_address() -> str | None:
    """An IPv4 address of this machine's own (not loopback, not a container bridge), if it has one."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, address = line.split()[1], line.split()[3].split("/")[0]
        if name != "lo" and not name.startswith(("docker", "br-", "hrl", "veth")):
            return address
    return None


@pytest.mark.parametrize("capture_host", ["0.0.0.0", ServeConfig().capture_host, "host-address"])
def test_agent_in_a_container_calls_the_capture_port(
    docker_ready, tmp_path, sandbox_root, engine_url, capture_host
):
    """On 0.0.0.0 a container reaches the capture port at its bridge gateway directly; on loopback (the
    default) or on one address of the host, through the docker backend's forwarder on that gateway."""
    if capture_host == "host-address":
        capture_host = _host_address() or pytest.skip("this machine has no address but loopback")
    config = make_config(
        tmp_path, sandbox="docker", capture_host=capture_host, llm_url=engine_url, model=MODEL
    )
    with (
        running_server(config, **SERVER_KWARGS) as server,
        HarborSessionFactory(server.url, split="builtin", harness="scripted", purpose="eval") as factory,
    ):
        session = factory.create("fix-pagination", episode_id="from-docker")
        result = session.wait_for_completion(timeout_s=500)
        assert result.status == "completed", result.error
        assert result.tool_calls_by_name == {"chat": 1, "marker:from-docker": 1}
        [turn] = session.fetch_training_trace().turns
        assert turn.request["messages"][0]["content"] == "from-docker"
