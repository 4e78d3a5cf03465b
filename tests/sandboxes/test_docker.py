"""The docker backend against the real engine: image cache, limits, containment, network confinement.

Network tests only ever contact addresses of this machine (its own interfaces, a container on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import subprocess
import time
import uuid

import pytest

from sandboxes import SandboxBuildError, SandboxSpec, SandboxUnavailable
from sandboxes.docker import OWNER_LABEL, SANDBOX_LABEL, DockerBackend

from .conftest import BASE_IMAGE, write_env

pytestmark = pytest.mark.docker

CONNECT = (
    'python3 -c "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); '
    'print(s.recv(100).decode().strip())"'
)


def spec(**overrides) -> SandboxSpec:
    values = {"name": f"dk-{uuid.uuid4().hex[:8]}", "docker_image": BASE_IMAGE}
    values.update(overrides)
    return SandboxSpec(**values)


def host_ipv4_addresses() -> dict[str, str]:
    """This machine's IPv4 addresses by interface (loopback and harbor-rl bridges excluded)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        name, address = parts[1], parts[3].split("/")[0]
        if name != "lo" and not name.startswith("hrl"):
            found[name] = address
    return found


@contextlib.asynccontextmanager
async def tcp_server(label: str, host: str = "0.0.0.0"):
    """A tiny server on the host that greets with `label`; yields its port."""

    async def greet(reader, writer):
        writer.write(f"hello-{label}\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, host=host, port=0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def connect_from(sandbox, host: str, port: int) -> str | None:
    result = await sandbox.exec(f"{CONNECT} {host} {port}", timeout_s=20)
    return result.stdout.strip() if result.ok else None


async def test_image_cache_hit_on_identical_context(docker_backend, tmp_path):
    dockerfile = "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\nCOPY app.py /app/\nENV MODE=cached\nRUN echo built > /app/stamp\n"
    first = write_env(tmp_path / "a" / "environment", dockerfile, {"app.py": "print('v1')\n"})
    twin = write_env(tmp_path / "b" / "environment", dockerfile, {"app.py": "print('v1')\n"})
    changed = write_env(tmp_path / "c" / "environment", dockerfile, {"app.py": "print('v2')\n"})
    builder = docker_backend.builder
    builds_before = builder.builds

    a = await docker_backend.start(spec(docker_image=None, environment_dir=first))
    b = await docker_backend.start(spec(docker_image=None, environment_dir=twin))
    c = await docker_backend.start(spec(docker_image=None, environment_dir=changed))
    try:
        tags = [s.container.image.tags[0] for s in (a, b, c)]
        assert tags[0] == tags[1] and tags[0] != tags[2]
        assert all(t.startswith("harbor-rl/task-") for t in tags)
        assert builder.builds - builds_before <= 2  # the twin hit the cache (0 if a previous run built them)
        result = await b.exec("cat /app/stamp; python3 /app/app.py; echo $MODE")
        assert result.stdout == "built\nv1\ncached\n"
    finally:
        for sandbox in (a, b, c):
            await sandbox.stop()


async def test_build_failure_is_a_build_error_with_the_log(docker_backend, tmp_path):
    env_dir = write_env(
        tmp_path / "environment", "FROM harbor-rl/sandbox-base:bookworm\nRUN echo step-output && exit 9\n"
    )
    with pytest.raises(SandboxBuildError, match="step-output"):
        await docker_backend.start(spec(docker_image=None, environment_dir=env_dir))


def test_a_build_logs_its_start_its_steps_and_its_duration(
    docker_client, base_image, tmp_path, caplog, monkeypatch
):
    """A first build takes minutes with nothing else to show: it says so when it starts, logs each step
    and a line while a silent step runs, and how long it took. A cached image logs nothing."""
    from sandboxes import images

    monkeypatch.setattr(images, "BUILD_HEARTBEAT_S", 0.3)
    marker = uuid.uuid4().hex  # a context no earlier run built
    env_dir = write_env(
        tmp_path / "environment",
        f"FROM {BASE_IMAGE}\nRUN echo {marker} && sleep 1.5\nENV DONE=1\n",
    )
    builder = images.ImageBuilder(docker_client)
    caplog.set_level(logging.INFO, logger="sandboxes.images")
    tag = builder.task_image(env_dir, time.monotonic() + 300)
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "sandboxes.images"]
        assert f"building Docker image {tag} for {env_dir}" in lines[0]
        assert "first build of an image is slow" in lines[0] and "cached" in lines[0]
        assert any(re.search(rf"Step 2/\d+ : RUN echo {marker}", line) for line in lines)
        assert any(
            re.fullmatch(rf"still building {env_dir}: \d+ s so far, at step 2/\d+", line) for line in lines
        )
        assert re.fullmatch(rf"built {tag} for {re.escape(str(env_dir))} in \d+\.\d s .*", lines[-1])
        caplog.clear()
        assert builder.task_image(env_dir, time.monotonic() + 300) == tag
        assert not [r for r in caplog.records if r.name == "sandboxes.images"]
    finally:
        docker_client.images.remove(tag, force=True)


async def test_limits_and_labels_are_applied(docker_backend):
    sandbox = await docker_backend.start(spec(cpus=0.5, memory_mb=300, pids_limit=77))
    try:
        sandbox.container.reload()
        host_config = sandbox.container.attrs["HostConfig"]
        assert host_config["NanoCpus"] == 500_000_000
        assert host_config["Memory"] == 300 * 1024 * 1024
        assert host_config["MemorySwap"] == 300 * 1024 * 1024
        assert host_config["PidsLimit"] == 77
        assert host_config["Init"] is True
        labels = sandbox.container.labels
        assert labels[SANDBOX_LABEL] == "1" and labels[OWNER_LABEL].startswith(f"{os.getpid()}@")
    finally:
        await sandbox.stop()


async def test_fork_bomb_is_contained_and_the_sandbox_recovers(docker_backend):
    sandbox = await docker_backend.start(spec(pids_limit=64))
    try:
        bomb = await sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout_s=8)
        assert bomb.timed_out or bomb.exit_code != 0
        # The host test process survived (we are running) and the sandbox is usable again.
        for _ in range(30):
            after = await sandbox.exec("echo ok", timeout_s=10)
            if after.ok:
                break
            await asyncio.sleep(0.5)
        assert after.stdout == "ok\n"
    finally:
        await sandbox.stop()


async def test_memory_hog_is_killed_inside_and_the_sandbox_survives(docker_backend):
    sandbox = await docker_backend.start(spec(memory_mb=128))
    try:
        hog = await sandbox.exec(["python3", "-c", "x = bytearray(1 << 30); print('survived')"], timeout_s=60)
        assert hog.exit_code != 0 and "survived" not in hog.stdout
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"
    finally:
        await sandbox.stop()


async def test_only_the_proxy_port_on_the_host_is_reachable(docker_backend):
    async with tcp_server("proxy") as proxy_port, tcp_server("other") as other_port:
        sandbox = await docker_backend.start(spec(proxy_port=proxy_port))
        try:
            assert await connect_from(sandbox, sandbox.proxy_host, proxy_port) == "hello-proxy"
            assert await connect_from(sandbox, sandbox.proxy_host, other_port) is None
            for address in host_ipv4_addresses().values():  # the host's other addresses, any port
                assert await connect_from(sandbox, address, other_port) is None, address
                assert await connect_from(sandbox, address, proxy_port) is None, address
        finally:
            await sandbox.stop()


async def test_a_proxy_on_loopback_is_forwarded(docker_backend):
    async with tcp_server("loopback-proxy", host="127.0.0.1") as port:
        sandbox = await docker_backend.start(spec(proxy_port=port))
        try:
            assert await connect_from(sandbox, sandbox.proxy_host, port) == "hello-loopback-proxy"
        finally:
            await sandbox.stop()


def test_a_backend_reused_on_a_new_event_loop_still_forwards_to_the_proxy():
    """The forwarder lives on the loop that made it; a backend reused on another loop (a later test,
    a restarted server loop) must start a fresh one rather than keep a dead listener on the port."""
    backend = DockerBackend()

    async def one_rollout(port: int) -> str | None:
        sandbox = await backend.start(spec(proxy_port=port))
        try:
            return await connect_from(sandbox, sandbox.proxy_host, port)
        finally:
            await sandbox.stop()

    async def serve_and_connect() -> tuple[int, str | None]:
        async with tcp_server("loop", host="127.0.0.1") as bound:
            return bound, await one_rollout(bound)

    port, first = asyncio.run(serve_and_connect())
    assert first == "hello-loop"

    async def second() -> str | None:
        server = await asyncio.start_server(_greet_loop, host="127.0.0.1", port=port)
        try:
            return await one_rollout(port)
        finally:
            server.close()
            await server.wait_closed()
            await backend.aclose()

    assert asyncio.run(second()) == "hello-loop"


async def test_a_network_removed_from_outside_is_recreated_with_its_forwarder(docker_backend, docker_client):
    """`docker network rm` (or an engine that lost its networks) between two starts: the backend must
    notice and make the network again, not forward on the gone network's gateway (EADDRNOTAVAIL)."""
    import docker.errors

    async with tcp_server("before", host="127.0.0.1") as port:
        sandbox = await docker_backend.start(spec(proxy_port=port))
        old_network = sandbox.network
        try:
            assert await connect_from(sandbox, sandbox.proxy_host, port) == "hello-before"
        finally:
            await sandbox.stop()
    try:
        docker_client.networks.get(old_network.name).remove()
    except docker.errors.APIError as exc:  # only when another process's sandboxes are attached
        pytest.skip(f"{old_network.name} is in use elsewhere, cannot remove it: {exc}")

    async with tcp_server("after", host="127.0.0.1") as port:
        sandbox = await docker_backend.start(spec(proxy_port=port))
        try:
            assert sandbox.network.id != old_network.id
            assert await connect_from(sandbox, sandbox.proxy_host, port) == "hello-after"
        finally:
            await sandbox.stop()


async def _greet_loop(reader, writer):
    writer.write(b"hello-loop\n")
    await writer.drain()
    writer.close()


async def test_no_network_reaches_no_other_machine_address(docker_backend):
    """A server in a `public` sandbox on this machine stands in for "the Internet": unreachable."""
    server = await docker_backend.start(spec(network_mode="public"))
    client = await docker_backend.start(spec(network_mode="no-network"))
    try:
        await server.exec("nohup python3 -m http.server 8080 >/dev/null 2>&1 &")
        server.container.reload()
        server_ip = server.container.attrs["NetworkSettings"]["Networks"]["harbor-rl-public"]["IPAddress"]
        probe = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://{server_ip}:8080/', timeout=2).status)\""
        ready = await server.exec(probe.replace(server_ip, "127.0.0.1"), timeout_s=20)
        for _ in range(20):
            if ready.ok:
                break
            await asyncio.sleep(0.25)
            ready = await server.exec(probe.replace(server_ip, "127.0.0.1"), timeout_s=20)
        assert ready.stdout.strip() == "200"
        assert not (await client.exec(probe, timeout_s=20)).ok
    finally:
        await server.stop()
        await client.stop()


async def test_allowlist_reaches_allowed_addresses_only(docker_backend):
    addresses = host_ipv4_addresses()
    allowed_ip = addresses.get("eth0") or next(iter(addresses.values()))
    async with tcp_server("allowed") as port:
        allowed = await docker_backend.start(spec(network_mode="allowlist", allowed_hosts=[allowed_ip]))
        blocked = await docker_backend.start(spec(network_mode="no-network"))
        try:
            assert await connect_from(allowed, allowed_ip, port) == "hello-allowed"
            assert await connect_from(blocked, allowed_ip, port) is None
            others = [a for a in addresses.values() if a != allowed_ip]
            for address in others:
                assert await connect_from(allowed, address, port) is None
        finally:
            await allowed.stop()
            await blocked.stop()
        rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
        assert allowed.container.name not in rules, "per-sandbox rules are removed on stop"


async def test_background_process_holding_stdout_does_not_hang_exec(docker_backend):
    sandbox = await docker_backend.start(spec())
    try:
        result = await sandbox.exec("sleep 60 & echo started", timeout_s=30)
        assert result.ok and result.stdout == "started\n" and result.duration_s < 15
    finally:
        await sandbox.stop()


async def test_sweep_removes_containers_of_dead_owners(docker_backend, docker_client):
    orphan = docker_client.containers.run(
        BASE_IMAGE,
        ["sleep", "infinity"],
        detach=True,
        init=True,
        name=f"harbor-rl-orphan-{uuid.uuid4().hex[:8]}",
        labels={SANDBOX_LABEL: "1", OWNER_LABEL: f"{2**22 + 11}@{os.uname().nodename}"},
    )
    live = await docker_backend.start(spec())
    try:
        assert await docker_backend.sweep() >= 1
        assert orphan.id not in [c.id for c in docker_client.containers.list(all=True)]
        assert (await live.exec("echo still-here")).stdout == "still-here\n"
    finally:
        await live.stop()
        with contextlib.suppress(Exception):
            orphan.remove(force=True)


async def test_unreachable_engine_is_unavailable_with_a_clear_message(tmp_path):
    backend = DockerBackend(base_url=f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(SandboxUnavailable, match="cannot reach the Docker engine"):
        await backend.health()
    with pytest.raises(SandboxUnavailable):
        await backend.start(spec())


async def test_teardown_removes_networks_and_rules_once_idle(docker_client):
    backend = DockerBackend()
    sandbox = await backend.start(spec())
    assert await backend.teardown() is False, "a running sandbox keeps its network and rules"
    assert "HRL-IN" in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    await sandbox.stop()
    removed = await backend.teardown()
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    others = docker_client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}=1"})
    if removed:
        assert "HRL-" not in rules
        assert not docker_client.networks.list(names=["harbor-rl-nonet"])
    else:  # another test run on this engine still has sandboxes
        assert others or docker_client.networks.list(names=["harbor-rl-nonet"])


async def test_harness_layers_build_on_the_task_image_and_are_cached(docker_backend, tmp_path):
    from sandboxes import ImageLayer

    env_dir = write_env(tmp_path / "environment", "FROM harbor-rl/sandbox-base:bookworm\nWORKDIR /app\n")
    context = tmp_path / "layer"
    context.mkdir()
    (context / "agent.txt").write_text("agent files")
    layer = ImageLayer(
        name="test-agent-1",
        dockerfile_lines=["COPY agent.txt /opt/agent/", "ENV AGENT=1"],
        context_dir=context,
    )
    first = await docker_backend.start(spec(docker_image=None, environment_dir=env_dir, image_layers=[layer]))
    builds = docker_backend.builder.builds
    second = await docker_backend.start(
        spec(docker_image=None, environment_dir=env_dir, image_layers=[layer])
    )
    try:
        assert docker_backend.builder.builds == builds, "the second start reuses both cached images"
        assert first.container.image.id == second.container.image.id
        assert (await second.exec("cat /opt/agent/agent.txt; echo $AGENT")).stdout == "agent files1\n"
    finally:
        await first.stop()
        await second.stop()


async def test_cancelled_exec_is_killed_and_a_vanished_container_is_an_error(docker_backend):
    from sandboxes import SandboxError

    from .test_protocol import host_processes_matching

    sandbox = await docker_backend.start(spec())
    try:
        task = asyncio.ensure_future(sandbox.exec("sleep 30.4321"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if not host_processes_matching("sleep 30.4321"):
                break
            await asyncio.sleep(0.1)
        assert host_processes_matching("sleep 30.4321") == []

        sandbox.container.remove(force=True)  # the container dies under us
        with pytest.raises(SandboxError, match="not running"):
            await sandbox.exec("true")
    finally:
        await sandbox.stop()
