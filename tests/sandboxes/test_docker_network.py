"""What a Docker sandbox reaches in each network mode and phase: never the host's own services nor its
neighbours, the internet when public, only the capture proxy when a phase says `no-network`.

Real engine, real iptables. The internet check fetches the package index pip itself uses, with the
host's CA bundle handed in (this machine reaches it only through an intercepting proxy).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sandboxes import SandboxError, UnsupportedEnvironment
from sandboxes.docker import DockerBackend, gpu_requests

from .test_docker import connect_from, host_ipv4_addresses, spec, tcp_server

pytestmark = pytest.mark.docker

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def index_url() -> str:
    """The package index pip uses here (its default unless the machine configures a mirror)."""
    from pip._internal.models.index import PyPI

    return os.environ.get("PIP_INDEX_URL") or PyPI.simple_url + "/"


async def fetch_status(sandbox, url: str) -> str:
    """The HTTP status `url` answers inside `sandbox`, or curl's failure."""
    result = await sandbox.exec(
        [
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
            "--cacert",
            "/tmp/host-ca.crt",
            url,
        ],
        timeout_s=40,
    )
    return result.stdout.strip() if result.ok else f"failed: {result.stderr.strip()}"


async def public_sandbox(backend, **overrides):
    sandbox = await backend.start(spec(network_mode="public", **overrides))
    if HOST_CA.is_file():
        await sandbox.upload_file(HOST_CA, "/tmp/host-ca.crt")
    return sandbox


def iptables_rules() -> str:
    return subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout


async def test_public_reaches_neither_the_host_nor_its_neighbours_but_the_capture_port(docker_backend):
    async with tcp_server("proxy") as proxy_port, tcp_server("service") as service_port:
        sandbox = await public_sandbox(docker_backend, proxy_port=proxy_port)
        try:
            assert await connect_from(sandbox, sandbox.proxy_host, proxy_port) == "hello-proxy"
            assert await connect_from(sandbox, sandbox.proxy_host, service_port) is None
            addresses = host_ipv4_addresses()  # eth0, docker0 (the engine's own bridge), ...
            assert "eth0" in addresses
            for address in addresses.values():
                assert await connect_from(sandbox, address, service_port) is None, address
            # The cloud metadata address and another private neighbour: refused at once, no timeout.
            for address in ("169.254.169.254", "10.0.0.1", "192.168.0.1"):
                started = time.monotonic()
                assert await connect_from(sandbox, address, 80) is None, address
                assert time.monotonic() - started < 3, f"{address} should be refused, not time out"
        finally:
            await sandbox.stop()


async def test_public_reaches_the_internet_and_a_no_network_phase_keeps_only_the_proxy(docker_backend):
    url = index_url()
    async with tcp_server("proxy") as proxy_port:
        sandbox = await public_sandbox(docker_backend, proxy_port=proxy_port)
        try:
            assert await fetch_status(sandbox, url) == "200"  # name resolved by the host's (private) DNS

            await sandbox.apply_network("no-network", [])
            assert f"harbor-rl:{sandbox.name} phase" in iptables_rules()
            assert (await fetch_status(sandbox, url)).startswith("failed")
            assert await connect_from(sandbox, sandbox.proxy_host, proxy_port) == "hello-proxy"

            await sandbox.apply_network("public", [])  # back to what it started with
            assert f"harbor-rl:{sandbox.name} phase" not in iptables_rules()
            assert await fetch_status(sandbox, url) == "200"
        finally:
            await sandbox.stop()
        assert sandbox.name not in iptables_rules(), "a sandbox's rules go with it"


async def test_an_allowlist_phase_reaches_only_what_it_names(docker_backend):
    url = index_url()
    host_ip = host_ipv4_addresses()["eth0"]
    async with tcp_server("named") as port:
        sandbox = await public_sandbox(docker_backend)
        try:
            assert await connect_from(sandbox, host_ip, port) is None  # the host: never, unless named

            await sandbox.apply_network("allowlist", [host_ip])
            assert await connect_from(sandbox, host_ip, port) == "hello-named"
            assert (await fetch_status(sandbox, url)).startswith("failed")

            index_host = urlsplit(url).hostname
            await sandbox.apply_network("allowlist", [index_host])  # a name: pinned, no DNS needed
            hosts = (await sandbox.exec("cat /etc/hosts")).stdout
            assert index_host in hosts and "harbor-rl phase" in hosts
            assert await fetch_status(sandbox, url) == "200"
            assert await connect_from(sandbox, host_ip, port) is None

            await sandbox.apply_network("public", [])
            assert "harbor-rl phase" not in (await sandbox.exec("cat /etc/hosts")).stdout
        finally:
            await sandbox.stop()


async def test_a_phase_never_widens_what_the_sandbox_started_with(docker_backend):
    host_ip = host_ipv4_addresses()["eth0"]
    closed = await docker_backend.start(spec(network_mode="no-network"))
    listed = await docker_backend.start(spec(network_mode="allowlist", allowed_hosts=[host_ip]))
    try:
        with pytest.raises(SandboxError, match="wider than the no-network"):
            await closed.apply_network("public", [])
        with pytest.raises(SandboxError, match="wider than the allowlist"):
            await listed.apply_network("allowlist", [host_ip, "10.1.2.3"])
        with pytest.raises(SandboxError, match="wider"):
            await listed.apply_network("public", [])
        async with tcp_server("listed") as port:
            assert await connect_from(listed, host_ip, port) == "hello-listed"
            await listed.apply_network("no-network", [])  # narrowing an allow-list: the host is closed
            assert await connect_from(listed, host_ip, port) is None
            await listed.apply_network("allowlist", [host_ip])
            assert await connect_from(listed, host_ip, port) == "hello-listed"
    finally:
        await closed.stop()
        await listed.stop()


async def test_sweep_removes_rules_of_sandboxes_that_are_gone(docker_backend):
    from sandboxes import firewall

    sandbox = await docker_backend.start(spec(network_mode="public"))
    ghost = "harbor-rl-ghost-0badc0de"
    firewall.insert(
        firewall.CHAIN_FWD,
        "-s",
        "10.254.254.254",
        "-m",
        "comment",
        "--comment",
        f"harbor-rl:{ghost} phase 1",
        "-j",
        "REJECT",
    )
    try:
        await sandbox.apply_network("no-network", [])
        await docker_backend.sweep()
        rules = iptables_rules()
        assert ghost not in rules
        assert f"harbor-rl:{sandbox.name} phase" in rules, "a live sandbox keeps its rules"
    finally:
        firewall.remove(ghost)
        await sandbox.stop()


def test_gpus_become_device_requests():
    (request,) = gpu_requests(2)
    assert request["Count"] == 2 and request["Capabilities"] == [["gpu"]]
    assert gpu_requests(0) == []


async def test_an_engine_without_gpus_refuses_them_clearly(docker_backend, docker_client):
    if any("nvidia" in name for name in (docker_client.info().get("Runtimes") or {})):
        pytest.skip("this engine has the NVIDIA runtime")
    with pytest.raises(
        UnsupportedEnvironment, match=r"asks for 1 GPU\(s\) and the Docker engine cannot attach them"
    ):
        await docker_backend.start(spec(gpus=1))


def test_base_chain_is_the_documented_layout():
    """HRL-BASE as installed equals what `base_rules` describes (so `install` leaves it alone)."""
    from sandboxes import firewall

    DockerBackend()._ensure_firewall()
    listed = [line for line in iptables_rules().splitlines() if line.startswith(f"-A {firewall.CHAIN_BASE} ")]
    wanted = firewall.base_rules(firewall.host_dns_servers(), firewall.host_lan_subnets())
    assert listed == [f"-A {firewall.CHAIN_BASE} {' '.join(rule)}" for rule in wanted]
    assert any("--dport 53" in line for line in listed), "the host's resolvers stay reachable"
    assert any("169.254.0.0/16" in line for line in listed)


@pytest.mark.parametrize("mode", ["public", "no-network", "allowlist"])
async def test_a_listener_on_the_sandbox_bridge_gateway_is_refused_but_the_capture_port_answers(
    docker_backend, mode
):
    """A host service bound to the very address the sandbox's bridge has on the host (its gateway), and
    one on 0.0.0.0: neither answers, in any mode; the capture proxy at the same gateway does."""
    hosts = ["198.51.100.7"] if mode == "allowlist" else []  # TEST-NET-2: nothing is ever sent there
    async with tcp_server("proxy") as proxy_port, tcp_server("anywhere") as any_port:
        sandbox = await docker_backend.start(
            spec(network_mode=mode, allowed_hosts=hosts, proxy_port=proxy_port)
        )
        try:
            gateway = sandbox.proxy_host
            async with tcp_server("gateway", host=gateway) as gateway_port:
                assert await connect_from(sandbox, gateway, proxy_port) == "hello-proxy"
                assert await connect_from(sandbox, gateway, gateway_port) is None
                assert await connect_from(sandbox, gateway, any_port) is None
        finally:
            await sandbox.stop()
