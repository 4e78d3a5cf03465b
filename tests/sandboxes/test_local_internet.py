"""The internet half of a public local sandbox: it still reaches "the internet", checked against a server
in a network namespace this test makes, never a real host.

The test makes two namespaces joined by a veth: "host" (203.0.113.2/24, default route via .1) and
"internet" (203.0.113.1, and 198.51.100.1 on its loopback, where an HTTP server runs). The sandbox's
host side (LocalBackend, slirp4netns) runs in "host", so slirp's connections go out of its veth as a
real host's would out of its LAN. All addresses are documentation ranges (TEST-NET-2 and -3) on
interfaces the test created; nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandboxes import local_network

REPO = Path(__file__).resolve().parents[2]
INTERNET = "198.51.100.1"
HOST_LAN = "203.0.113.2"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or local_network.public_network_problem() is not None,
    reason="needs root and ip to make namespaces, and the public local sandbox's tools",
)

# Runs inside the test's "host" namespace: a public sandbox fetches from the "internet", tries the
# host's own LAN address (a listener on 0.0.0.0 there), and an allow-list that names the server or not.
HOST_SIDE = r"""
import asyncio, json, socket, sys
from sandboxes import SandboxSpec
from sandboxes.local import LocalBackend

FETCH = '''
import json, socket, sys, urllib.request
out = {}
try:
    out["internet"] = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
except OSError as exc:
    out["internet"] = type(exc).__name__
try:
    socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=3).close()
    out["host_lan"] = "open"
except OSError as exc:
    out["host_lan"] = type(exc).__name__
print(json.dumps(out))
'''

async def main(root, url, host_lan):
    listener = socket.create_server(("0.0.0.0", 0))
    port = listener.getsockname()[1]
    backend = LocalBackend(root=root, isolation="bwrap")
    seen = {}
    for name, mode, hosts in [("public", "public", []), ("allowed", "allowlist", [sys.argv[4]]),
                              ("not_allowed", "allowlist", ["198.51.100.9"])]:
        sandbox = await backend.start(SandboxSpec(name=name, network_mode=mode, allowed_hosts=hosts))
        try:
            result = await sandbox.exec(["python3", "-c", FETCH, url, host_lan, str(port)], timeout_s=30)
            seen[name] = json.loads(result.stdout) if result.exit_code == 0 else result.stderr
        finally:
            await sandbox.stop()
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def internet(tmp_path):
    """The two namespaces, the veth and the HTTP server; yields (host namespace, URL of a file)."""
    tag = uuid.uuid4().hex[:6]
    host, net = f"hrlt-host-{tag}", f"hrlt-inet-{tag}"
    ip("netns", "add", host)
    ip("netns", "add", net)
    server = None
    try:
        ip("link", "add", f"hrlt{tag}h", "type", "veth", "peer", "name", f"hrlt{tag}i")
        ip("link", "set", f"hrlt{tag}h", "netns", host)
        ip("link", "set", f"hrlt{tag}i", "netns", net)
        for ns, dev, address in ((host, f"hrlt{tag}h", HOST_LAN), (net, f"hrlt{tag}i", "203.0.113.1")):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", net, "addr", "add", f"{INTERNET}/32", "dev", "lo")
        ip("-n", host, "route", "add", "default", "via", "203.0.113.1")
        site = tmp_path / "site"
        site.mkdir()
        (site / "hello.txt").write_text("hello from the test internet")
        server = subprocess.Popen(
            ["ip", "netns", "exec", net, sys.executable, "-m", "http.server", "8080", "--bind", INTERNET],
            cwd=site,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):  # until it listens
            probe = ["ip", "netns", "exec", net, "ss", "-ltnH", f"src {INTERNET}:8080"]
            if subprocess.run(probe, capture_output=True, text=True).stdout.strip():
                break
            time.sleep(0.05)
        yield host, f"http://{INTERNET}:8080/hello.txt"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", net], capture_output=True)  # the veth goes with them


def test_a_public_local_sandbox_reaches_the_internet_but_not_the_host(internet, tmp_path):
    host, url = internet
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            host,
            sys.executable,
            "-c",
            HOST_SIDE,
            str(tmp_path / "sb"),
            url,
            HOST_LAN,
            INTERNET,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    fetched = "hello from the test internet"
    assert seen["public"] == {"internet": fetched, "host_lan": "ConnectionRefusedError"}
    assert seen["allowed"] == {"internet": fetched, "host_lan": "ConnectionRefusedError"}
    assert seen["not_allowed"]["internet"] != fetched  # refused: the list does not name the server
    assert seen["not_allowed"]["host_lan"] == "ConnectionRefusedError"
