"""The local sandbox's network (real bwrap, socat, slirp4netns and nft): in every mode the capture proxy
is at the address the harness is given and no address of the host is reachable, loopback or not;
`public` and `allowlist` get their own slirp4netns namespace, filtered; a mode the machine cannot
isolate is refused in one line. (The internet half, against a test-made "internet": test_local_internet.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from engine.in_process import serve_in_thread
from sandboxes import SandboxSpec, UnsupportedEnvironment, local_network
from sandboxes.local import LocalBackend

pytestmark = pytest.mark.skipif(
    local_network.public_network_problem() is not None, reason=str(local_network.public_network_problem())
)

PROBE = r"""
import json, socket, sys, urllib.request
out = {}
for name, host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[name] = "open"
    except OSError as exc:
        out[name] = type(exc).__name__
proxy = json.loads(sys.argv[2])
if proxy:
    out["proxy_body"] = urllib.request.urlopen(proxy + "/stream", timeout=10).read().decode()
print(json.dumps(out))
"""


def tiny_proxy() -> FastAPI:
    """Stands in for the capture port: a streamed body checks the relay passes SSE-like chunks whole."""
    app = FastAPI()

    @app.get("/stream")
    async def stream():
        async def chunks():
            for i in range(3):
                yield f"data: {i}\n\n"
                await asyncio.sleep(0.01)

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


@pytest.fixture
def proxy_port():
    with serve_in_thread(tiny_proxy()) as url:
        yield int(url.rsplit(":", 1)[1])


@pytest.fixture
def host_listener():
    """Another service on the host's loopback (the engine, the trainer API, PostgreSQL stand for it)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def any_listener():
    """A service on every address of the host (0.0.0.0): its LAN address, its Docker bridge gateways."""
    server = socket.create_server(("0.0.0.0", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def spec(**overrides) -> SandboxSpec:
    return SandboxSpec(name=f"net-{uuid.uuid4().hex[:8]}", **overrides)


async def probe(sandbox, targets, proxy_url: str | None = None) -> dict:
    result = await sandbox.exec(["python3", "-c", PROBE, json.dumps(targets), json.dumps(proxy_url)])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def host_address() -> str | None:
    """A non-loopback address of this host, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            return s.getsockname()[0]
        except OSError:
            return None


async def test_without_internet_only_the_capture_proxy_is_reachable(local_backend, proxy_port, host_listener):
    sandbox = await local_backend.start(spec(proxy_port=proxy_port, network_mode="no-network"))
    try:
        assert sandbox.network == "isolated"
        url = f"http://{sandbox.proxy_host}:{proxy_port}"
        targets = [["proxy", "127.0.0.1", proxy_port], ["listener", "127.0.0.1", host_listener]]
        if address := host_address():
            targets.append(["host_address", address, host_listener])
        seen = await probe(sandbox, targets, url)
        assert seen["proxy"] == "open"
        assert seen["proxy_body"] == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert seen["listener"] == "ConnectionRefusedError"
        if address:
            assert seen["host_address"] != "open"
        # The host does see its listener: only the sandbox is cut off.
        socket.create_connection(("127.0.0.1", host_listener), timeout=3).close()
        # The forwarder's socket folder is read-only inside: the agent cannot remove or replace it.
        tamper = await sandbox.exec("rm -f /run/harbor-net/proxy.sock; touch /run/harbor-net/x")
        assert tamper.exit_code != 0
        assert (await probe(sandbox, [], url))["proxy_body"].startswith("data: 0")
    finally:
        await sandbox.stop()


async def test_stop_takes_the_forwarder_down(local_backend, proxy_port):
    sandbox = await local_backend.start(spec(proxy_port=proxy_port))
    folder = sandbox._forwarder.folder
    assert (folder / "proxy.sock").exists()
    await sandbox.stop()
    assert not folder.exists()


async def test_without_a_proxy_port_nothing_is_reachable(local_backend, host_listener):
    sandbox = await local_backend.start(spec())
    try:
        assert sandbox.network == "isolated"
        seen = await probe(sandbox, [["listener", "127.0.0.1", host_listener]])
        assert seen["listener"] == "ConnectionRefusedError"
    finally:
        await sandbox.stop()


async def test_public_reaches_the_proxy_and_no_address_of_the_host(
    local_backend, proxy_port, host_listener, any_listener
):
    sandbox = await local_backend.start(spec(proxy_port=proxy_port, network_mode="public"))
    try:
        assert sandbox.network == "public"
        targets = [["loopback", "127.0.0.1", host_listener], ["slirp_gateway", "10.0.2.2", host_listener]]
        # Every address of the host (its LAN IP, docker0 and other bridges' gateways), and the cloud
        # metadata address (nothing listens there: it must be refused, not time out).
        targets += [[f"host {a}", a, any_listener] for a in local_network.host_addresses()]
        targets += [["metadata", "169.254.169.254", 80]]
        seen = await probe(sandbox, targets, f"http://127.0.0.1:{proxy_port}")
        assert seen.pop("proxy_body") == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert seen == {name: "ConnectionRefusedError" for name, _, _ in targets}
        # The host does see its listeners: only the sandbox is cut off.
        socket.create_connection(("127.0.0.1", any_listener), timeout=3).close()
        # Root in the sandbox owns nothing of the namespace: the filter and the routes stay.
        tamper = await sandbox.exec("nft flush ruleset || ip route del default || ip link set tap0 down")
        assert tamper.exit_code != 0 and "Operation not permitted" in tamper.stderr
        assert (await sandbox.exec("cat /etc/resolv.conf")).stdout == "nameserver 10.0.2.3\n"
    finally:
        await sandbox.stop()


async def test_stop_ends_the_namespace_processes(local_backend, proxy_port):
    sandbox = await local_backend.start(spec(proxy_port=proxy_port, network_mode="public"))
    assert (await sandbox.exec("true")).exit_code == 0
    namespace = sandbox._public
    procs = [namespace._holder, namespace._slirp, namespace._socat]
    assert all(p is not None and p.returncode is None for p in procs)
    await sandbox.stop()
    assert all(p.returncode is not None for p in procs)
    assert not sandbox.folder.exists()


async def test_a_phase_without_network_isolates_a_public_sandbox_and_never_widens(
    local_backend, proxy_port, host_listener
):
    from sandboxes import SandboxError

    sandbox = await local_backend.start(spec(proxy_port=proxy_port, network_mode="public"))
    closed = await local_backend.start(spec(proxy_port=proxy_port, network_mode="no-network"))
    targets = [["listener", "127.0.0.1", host_listener]]
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        await sandbox.apply_network("no-network", [])  # the agent's phase
        assert sandbox.network == "isolated"
        seen = await probe(sandbox, targets, url)
        assert seen["listener"] == "ConnectionRefusedError" and seen["proxy_body"].startswith("data: 0")
        await sandbox.apply_network("public", [])  # the verifier's: the task's own network again
        seen = await probe(sandbox, targets, url)
        assert seen["listener"] == "ConnectionRefusedError" and seen["proxy_body"].startswith("data: 0")
        await sandbox.apply_network("allowlist", ["198.51.100.7"])  # narrowing further is allowed
        assert "ip daddr 198.51.100.7 accept" in sandbox_rules(sandbox)
        with pytest.raises(SandboxError, match="wider than the no-network"):
            await closed.apply_network("public", [])
        assert (await probe(closed, targets, url))["listener"] == "ConnectionRefusedError"
    finally:
        await sandbox.stop()
        await closed.stop()


def sandbox_rules(sandbox) -> str:
    """The filter of a sandbox's public namespace, as the host sees it."""
    import subprocess

    argv = [*sandbox._public.enter_argv(), "nft", "list", "ruleset"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


async def test_build_steps_have_internet_but_not_the_host_like_docker_build(
    local_backend, tmp_path, host_listener
):
    from .conftest import write_env

    # connect_ex: the errno, 111 (ECONNREFUSED) when the filter refuses it, 0 when it got through
    connect = f"import socket; e = socket.socket().connect_ex(('127.0.0.1', {host_listener})); open('/app/seen', 'w').write(str(e))"
    env = write_env(tmp_path / "env", f'FROM harbor-rl/sandbox-base:bookworm\nRUN python3 -c "{connect}"\n')
    sandbox = await local_backend.start(spec(environment_dir=env))
    try:
        assert (await sandbox.download_file("/app/seen")) == b"111"
        seen = await probe(sandbox, [["listener", "127.0.0.1", host_listener]])
        assert seen["listener"] == "ConnectionRefusedError"  # the agent's execs are cut off too
    finally:
        await sandbox.stop()


async def test_an_allowlist_reaches_only_its_pinned_addresses(local_backend, proxy_port, any_listener):
    hosts = ["198.51.100.7", "203.0.113.0/28"]
    sandbox = await local_backend.start(
        spec(proxy_port=proxy_port, network_mode="allowlist", allowed_hosts=hosts)
    )
    try:
        assert sandbox.network == "public"
        targets = [[f"host {a}", a, any_listener] for a in local_network.host_addresses()]
        seen = await probe(sandbox, targets + [["dns", "10.0.2.3", 53]], f"http://127.0.0.1:{proxy_port}")
        assert seen.pop("proxy_body").startswith("data: 0")
        assert set(seen.values()) == {"ConnectionRefusedError"}  # no DNS either: names are pinned
        rules = sandbox_rules(sandbox)
        assert "ip daddr { 198.51.100.7, 203.0.113.0/28 } accept" in rules, rules
    finally:
        await sandbox.stop()


async def test_a_mode_that_cannot_be_isolated_is_refused_in_one_line(tmp_path, monkeypatch, proxy_port):
    from sandboxes import local

    monkeypatch.setattr(local_network, "socat_path", lambda: None)
    with pytest.raises(UnsupportedEnvironment, match="network no-network: socat not installed") as caught:
        await LocalBackend(root=tmp_path / "a", isolation="auto").start(spec(proxy_port=proxy_port))
    assert "\n" not in str(caught.value) and "--sandbox docker" in str(caught.value)
    monkeypatch.setattr(local_network, "public_network_problem", lambda: "slirp4netns not installed (...)")
    with pytest.raises(UnsupportedEnvironment, match="network public: slirp4netns not installed"):
        await LocalBackend(root=tmp_path / "b", isolation="bwrap").start(spec(network_mode="public"))
    monkeypatch.setattr(local, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    backend = LocalBackend(root=tmp_path / "c", isolation="auto")
    for mode in ("public", "no-network"):
        with pytest.raises(UnsupportedEnvironment, match=f"network {mode}: bubblewrap"):
            await backend.start(spec(network_mode=mode))
    assert local.network_refusal("public", isolation="none") is None  # no isolation, asked for by name


def relays_of(port: int) -> list[str]:
    """The socat relays listening on `port` in some sandbox's namespace, by their command lines."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmd.startswith("socat ") and f"TCP-LISTEN:{port}," in cmd:
            found.append(cmd)
    return found


@pytest.mark.parametrize("ending", ["exits", "times out"])
async def test_the_relay_ends_with_its_command(local_backend, proxy_port, ending):
    """A command's socat relay lives exactly as long as the command, however it ends (a timeout kills
    the command's process group, which the relay's own session escapes)."""
    sandbox = await local_backend.start(spec(proxy_port=proxy_port))
    try:
        if ending == "exits":
            assert (await sandbox.exec("true")).exit_code == 0
        else:
            assert (await sandbox.exec("sleep 60", timeout_s=1)).timed_out
        for _ in range(100):
            if not relays_of(proxy_port):
                break
            await asyncio.sleep(0.05)
        assert relays_of(proxy_port) == []
    finally:
        await sandbox.stop()


async def test_stopping_the_forwarder_mid_relay_logs_no_traceback(caplog):
    # A rollout that ends while its agent holds a connection to the proxy (harbor train stopping its
    # rollouts): the relay is cut quietly, not with asyncio's "Exception in callback" traceback.
    from sandboxes.local_network import SOCKET_NAME, ProxyForwarder

    idle = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
    forwarder = ProxyForwarder(idle.sockets[0].getsockname()[1])
    folder = await forwarder.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(folder / SOCKET_NAME))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        for _ in range(100):  # the relay is up once the forwarder has its task
            if forwarder._relays:
                break
            await asyncio.sleep(0.01)
        assert forwarder._relays
        await forwarder.stop()
        await asyncio.sleep(0.05)  # let the stream server's done-callback run
        assert await reader.read() == b""  # the agent's side is closed
        writer.close()
    finally:
        await forwarder.stop()
        idle.close()
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelname == "ERROR"]


async def test_public_resolves_names_through_slirp_and_fetches_the_package_index(local_backend):
    """DNS goes through slirp4netns's forwarder (10.0.2.3, the one private address let through) to the
    host's resolvers; the index is the one pip uses, as in test_docker_network.py."""
    from .test_docker_network import index_url

    sandbox = await local_backend.start(spec(network_mode="public"))
    try:
        fetch = (
            "curl -sS -o /dev/null -w '%{http_code}' --max-time 20 "
            f"--cacert /etc/ssl/certs/ca-certificates.crt {index_url()}"
        )
        result = await sandbox.exec(fetch, timeout_s=40)
        assert result.stdout == "200", result.stderr
    finally:
        await sandbox.stop()
