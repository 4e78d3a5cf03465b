"""Sandboxed code never reaches the host: the host-probe task (tests/fixtures/host_probe) through the real
`harbor eval --harness oracle`, on `local` and `docker`, in every network mode.

The test listens on 0.0.0.0 (so its loopback, its LAN address and its Docker bridge gateways all lead
to the listener); the task's oracle tries the sandbox's loopback, its default gateway (slirp4netns's
alias of the host's loopback, a Docker bridge's gateway) and every address of the host; the verifier
gives 1 only when every try was refused. The listener must count no connection at all. A machine that
cannot isolate a mode refuses it at start-up, in one line, and never runs it on the host's network.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sandboxes import local_network

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "host_probe" / "host-probe"
MODES = {
    "public": 'network_mode = "public"',
    "no-network": 'network_mode = "no-network"',
    "allowlist": 'network_mode = "allowlist"\nallowed_hosts = ["198.51.100.7"]',  # TEST-NET-2: never sent to
}


class CountingListener:
    """A TCP listener on every address of the host that counts the connections it accepts."""

    def __init__(self) -> None:
        self.server = socket.create_server(("0.0.0.0", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()


@pytest.fixture
def listener():
    counting = CountingListener()
    yield counting
    counting.close()


def probe_dataset(root: Path, port: int) -> Path:
    """One copy of the host-probe task per network mode, told the listener's port and the host's
    addresses."""
    for mode, line in MODES.items():
        task = root / f"host-probe-{mode}"
        shutil.copytree(FIXTURE, task)
        toml = (task / "task.toml").read_text()
        toml = toml.replace('network_mode = "public"', line).replace(
            "test/host-probe", f"test/host-probe-{mode}"
        )
        (task / "task.toml").write_text(toml)
        (task / "solution" / "port").write_text(str(port))
        (task / "solution" / "addresses").write_text(" ".join(local_network.host_addresses()))
    return root


def harbor(*args: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARBOR_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "harbor_rl", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.parametrize("sandbox", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_host_probe_is_blocked_in_every_network_mode(sandbox, listener, tmp_path, request):
    if sandbox == "local" and (problem := local_network.public_network_problem()):
        pytest.skip(problem)
    if sandbox == "docker":
        request.getfixturevalue("base_image")  # skips without a Docker engine; builds the image if missing
    dataset = probe_dataset(tmp_path / "tasks", listener.port)
    done = harbor(
        "eval", "--dataset", str(dataset), "--harness", "oracle", "--sandbox", sandbox,
        "--output-dir", str(tmp_path / "jobs"), tmp_path=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(p.read_text()) for p in (tmp_path / "jobs").glob("*/*/result.json")]
    assert len(results) == len(MODES), done.stdout + done.stderr
    for result in results:
        assert result["verifier_result"]["rewards"]["reward"] == 1.0, result
    assert listener.accepted == 0, "a sandbox reached the host's listener"
    # The oracle really tried: its loopback, its gateway and each host address, all refused.
    logs = [p.read_text() for p in (tmp_path / "jobs").glob("*/*/agent/oracle.txt")]
    seen = [json.loads(line) for log in logs for line in log.splitlines() if line.startswith("{")]
    assert len(seen) == len(MODES), logs
    for tries in seen:
        assert {"loopback", *(f"host {a}" for a in local_network.host_addresses())} <= set(tries)
        assert "open" not in tries.values(), tries


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def path_without(tmp_path: Path, tool: str) -> str:
    """A PATH like this machine's, without `tool` (a folder of links to everything else on it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not Path(folder).is_dir():
            continue
        for entry in Path(folder).iterdir():
            link = bin_dir / entry.name
            if entry.name != tool and not link.exists() and not link.is_symlink():
                link.symlink_to(entry)
    return str(bin_dir)


@pytest.mark.parametrize("command", ["serve", "eval"])
def test_a_machine_without_slirp4netns_refuses_public_local_tasks_in_one_line(command, tmp_path):
    dataset = probe_dataset(tmp_path / "tasks", 9)
    (dataset / "host-probe-no-network").rename(tmp_path / "runnable")  # it stays runnable (socat is there)
    env_path = path_without(tmp_path, "slirp4netns")
    args = {
        "serve": ["serve", "--dataset", str(dataset), "--sandbox", "local", "--llm-url", "http://127.0.0.1:9/v1",
                  "--model", "m", "--port", free_port(), "--capture-port", free_port(), "--store", f"sqlite:///{tmp_path}/s.db"],
        "eval": ["eval", "--dataset", str(dataset), "--harness", "oracle", "--sandbox", "local",
                 "--output-dir", str(tmp_path / "jobs")],
    }[command]  # fmt: skip
    env = {**os.environ, "PATH": env_path, "HARBOR_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "300"}
    done = subprocess.run(
        [sys.executable, "-m", "harbor_rl", *args], capture_output=True, text=True, timeout=120, env=env
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    refusal = [line for line in lines if "slirp4netns not installed" in line]
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(refusal) == 1 and ("network public" in refusal[0] or "network allowlist" in refusal[0]), lines
    assert "--sandbox" in refusal[0] and "Traceback" not in done.stderr
    assert not list((tmp_path / "runs").rglob("owner.json")), "no sandbox was started"
