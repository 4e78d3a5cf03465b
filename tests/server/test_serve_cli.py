"""`harbor serve` as a user runs it (a real subprocess, its stderr read as they would read it, or typer's
CliRunner): a log line per rollout start and end, and a capture port on loopback unless asked
otherwise, with E2B sandboxes told what they need."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app as cli
from harbor_server.embedded import free_port
from tests.server.conftest import UNUSED_ENGINE
from tests.server.tunnel_stand_ins import CLOUDFLARED_BANNER, QUICK_URL, stand_in_binary

pytestmark = pytest.mark.timeout(180)


def _serve(tmp_path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, int]:
    port, capture_port = free_port(), free_port()
    cmd = [
        sys.executable, "-m", "harbor_rl", "serve", "--dataset", "builtin", "--llm-url", UNUSED_ENGINE,
        "--model", "tiny", "--port", str(port), "--capture-port", str(capture_port), "--sandbox", "local",
        "--store", f"sqlite:///{tmp_path}/traces.db", "--skip-engine-check", *extra,
    ]  # fmt: skip
    env = os.environ | {"HARBOR_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"} | (env or {})
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port, capture_port
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"harbor serve exited: {proc.stderr.read()}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail("harbor serve did not come up")


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def _other_ipv4() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, address = line.split()[1], line.split()[3].split("/")[0]
        if name != "lo" and not address.startswith("127."):
            return address
    return None


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_serve_keeps_the_capture_port_on_loopback_unless_asked(tmp_path):
    proc, _, capture_port = _serve(tmp_path)
    try:
        assert _accepts("127.0.0.1", capture_port)
        other = _other_ipv4()
        if other is not None:
            assert not _accepts(other, capture_port), f"the capture port answers on {other}"
    finally:
        output = _stop(proc)
    assert f"capture port: 127.0.0.1:{capture_port}" in output


def test_serve_logs_each_rollout_start_and_end(tmp_path):
    proc, port, _ = _serve(tmp_path)
    try:
        started = httpx.post(
            f"http://127.0.0.1:{port}/rollouts",
            json={"split": "builtin", "task_index": 0, "harness": "oracle", "sandbox": "local"},
            timeout=30,
        )
        assert started.status_code == 201, started.text
        rollout = started.json()["rollout_id"]
        state = httpx.get(f"http://127.0.0.1:{port}/rollouts/{rollout}/wait?timeout=120", timeout=130).json()
        assert state["status"] == "completed", state
        task = state["task_id"]
    finally:
        output = _stop(proc)
    lines = output.splitlines()
    [start] = [line for line in lines if f"rollout {rollout} started" in line]
    assert start.endswith(f"rollout {rollout} started: task {task}, harness oracle, sandbox local"), start
    [end] = [line for line in lines if f"rollout {rollout} completed" in line]
    assert re.search(
        rf"rollout {rollout} completed: task {re.escape(task)}, harness oracle, sandbox local, reward 1, "
        r"\d+\.\d s$",
        end,
    ), end
    assert " INFO " in start and " INFO " in end  # the default level shows them


def test_serve_expose_cloudflare_serves_at_the_tunnels_url_and_stops_cloudflared(tmp_path):
    """`--expose cloudflare` as a user runs it, with a stand-in cloudflared on PATH that logs the real one's
    quick-tunnel banner and runs until stopped: the URL is the public URL (summary, /info; E2B sandboxes
    are accepted), and SIGTERM to harbor serve stops cloudflared too."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "cloudflared"
    stand_in_binary(bin_dir / "cloudflared", record, CLOUDFLARED_BANNER, to="stderr", then="exec sleep 600")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "E2B_API_KEY": ""}
    proc, port, capture_port = _serve(tmp_path, "--expose", "cloudflare", "--sandbox", "e2b", env=env)
    try:
        info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=30).json()
        assert (info["expose"], info["public_url"]) == ("cloudflare", f"{QUICK_URL}/v1")
        pid = int(record.with_suffix(".pid").read_text())
    finally:
        output = _stop(proc)
    assert f"capture port: 127.0.0.1:{capture_port} = {QUICK_URL}/v1 (cloudflare tunnel)" in output
    assert "must be a tunnel to this machine" not in output  # it is one
    assert _stopped(pid), f"cloudflared (pid {pid}) still runs after harbor serve stopped"


def _stopped(pid: int) -> bool:
    """Gone, or a zombie nobody reaped (harbor serve exited; this container's init may not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_serve_log_level_is_checked(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "harbor_rl", "serve", "--log-level", "loud"],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": "200"},
        timeout=60,
    )
    assert result.returncode == 2
    assert "--log-level" in result.stderr and "choose one of debug, info, warning, error" in result.stderr


@pytest.fixture
def no_http(monkeypatch, tmp_path):
    """`harbor serve` in-process up to its summary: serving itself is not these tests' point."""
    from harbor_server.server import HarborServer

    async def no_http(self) -> None:
        return None

    monkeypatch.setattr(HarborServer, "run_http", no_http)
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))


def _serve_args(tmp_path, *extra: str) -> list[str]:
    return [
        "serve", "--llm-url", UNUSED_ENGINE, "--model", "tiny", "--skip-engine-check", "--port", str(free_port()),
        "--capture-port", str(free_port()), "--store", f"sqlite:///{tmp_path}/traces.db", *extra,
    ]  # fmt: skip


def test_serve_with_e2b_and_no_public_url_is_one_clear_error(no_http, tmp_path):
    result = CliRunner().invoke(cli, _serve_args(tmp_path, "--sandbox", "e2b"))
    assert result.exit_code == 2
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "--sandbox e2b" in output and "--public-url" in output and "--capture-host 0.0.0.0" in output


@pytest.mark.parametrize(("capture_host", "warned"), [(None, True), ("0.0.0.0", False)])
def test_serve_says_when_e2b_sandboxes_meet_a_loopback_capture_port(no_http, tmp_path, capture_host, warned):
    """The capture port stays on loopback unless asked; with a public URL for E2B sandboxes the summary
    says that URL must then be a tunnel, and how to listen publicly instead."""
    args = _serve_args(
        tmp_path, "--sandbox", "e2b", "--expose", "direct", "--public-url", "https://tunnel.example:8300"
    )
    if capture_host is not None:
        args += ["--capture-host", capture_host]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert ("listens on 127.0.0.1 only" in output) is warned, output
    if warned:
        assert "must be a tunnel to this machine" in output and "pass --capture-host 0.0.0.0" in output
