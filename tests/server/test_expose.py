"""`harbor serve --expose cloudflare|gradio|direct`: how remote (E2B) sandboxes reach the capture port.

Offline, each tunnel meets a stand-in of what it talks to:
- cloudflare: a stand-in `cloudflared` on PATH that logs what the real one logs (its quick tunnel
  banner on stderr, or the error it gives when Cloudflare is unreachable) and stays alive until killed.
- gradio: gradio's own `networking.setup_tunnel` and `tunneling.Tunnel` run unchanged; the two things
  they reach over the network are stood in for: Gradio's API server (a local HTTP server answering
  `GET` with `[{"host", "port", "root_ca"}]`, as api.gradio.app/v3/tunnel-request does) and the frpc
  binary gradio downloads (a script that logs frpc's `start proxy success: URL` on stdout). Both are
  module constants in gradio (`networking.GRADIO_API_SERVER`, and `tunneling.BINARY_PATH`, fixed
  under HF_HOME at import), so monkeypatching them is the narrowest way in: without it the test
  would talk to the real api.gradio.app whenever it is online.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from harbor_rl.cli import app as cli
from harbor_server.embedded import free_port
from harbor_server.errors import TunnelError
from harbor_server.tunnels import open_tunnel
from tests.server.conftest import UNUSED_ENGINE, make_config, running_server
from tests.server.tunnel_stand_ins import (
    CLOUDFLARED_BANNER,
    CLOUDFLARED_OFFLINE,
    FRPC_LOG,
    QUICK_URL,
    SHARE_URL,
    stand_in_binary,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cloudflared(tmp_path, monkeypatch):
    """Make a stand-in `cloudflared` first on PATH; returns where it records its pid and argv."""

    def install(output: str = CLOUDFLARED_BANNER, then: str = "exec sleep 600") -> Path:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        record = tmp_path / "cloudflared"
        stand_in_binary(bin_dir / "cloudflared", record, output, to="stderr", then=then)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return record

    return install


def _pid(record: Path) -> int:
    return int(Path(f"{record}.pid").read_text())


def _argv(record: Path) -> list[str]:
    return Path(f"{record}.argv").read_text().splitlines()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def no_e2b_key(monkeypatch, tmp_path):
    monkeypatch.delenv("E2B_API_KEY", raising=False)  # the e2b backend is built, never called
    monkeypatch.setenv("HARBOR_RUNS_DIR", str(tmp_path / "runs"))


def test_cloudflare_tunnel_url_is_the_public_url_and_the_tunnel_stops_with_the_server(
    tmp_path, cloudflared, no_e2b_key
):
    record = cloudflared()
    config = make_config(tmp_path, expose="cloudflare")
    with running_server(config) as server:
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        assert info["expose"] == "cloudflare"
        assert info["public_url"] == f"{QUICK_URL}/v1"
        # E2B sandboxes are given the tunnel's URL.
        assert server.server.manager.backend("e2b").proxy_url == QUICK_URL
        assert _argv(record) == [
            "tunnel",
            "--no-autoupdate",
            "--url",
            f"http://127.0.0.1:{config.capture_port}",
        ]
        pid = _pid(record)
        assert not _gone(pid)
    assert _gone(pid), "cloudflared still runs after the server stopped"
    assert server.server.tunnel is None


def test_cloudflared_that_cannot_reach_cloudflare_is_one_line_not_its_api_url(cloudflared):
    """Offline cloudflared names https://api.trycloudflare.com in its error and exits: that is no tunnel."""
    cloudflared(CLOUDFLARED_OFFLINE, then="exit 1")
    with pytest.raises(TunnelError) as caught:
        open_tunnel("cloudflare", "127.0.0.1", free_port(), timeout_s=30)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cloudflared exited (code 1) before printing a trycloudflare.com URL")
    assert "no such host" in message and "--expose direct --public-url URL" in message


def test_cloudflared_that_prints_no_url_is_stopped_at_the_timeout(cloudflared):
    record = cloudflared("2025-05-01T10:00:00Z INF Requesting new quick Tunnel on trycloudflare.com...\n")
    with pytest.raises(TunnelError, match=r"printed no trycloudflare\.com URL within 1 s"):
        open_tunnel("cloudflare", "127.0.0.1", free_port(), timeout_s=1)
    assert _gone(_pid(record))


def _serve_args(tmp_path, *extra: str) -> list[str]:
    return [
        "serve", "--llm-url", UNUSED_ENGINE, "--model", "tiny", "--skip-engine-check", "--port", str(free_port()),
        "--capture-port", str(free_port()), "--store", f"sqlite:///{tmp_path}/traces.db", *extra,
    ]  # fmt: skip


def test_serve_expose_cloudflare_without_cloudflared_says_how_to_install_it(
    tmp_path, monkeypatch, no_e2b_key
):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = CliRunner().invoke(cli, _serve_args(tmp_path, "--expose", "cloudflare"))
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "harbor serve cannot start: --expose cloudflare needs the cloudflared binary on PATH" in output
    assert (
        "install it (https://developers.cloudflare.com/" in output
        and "--expose direct --public-url" in output
    )
    assert "Traceback" not in result.output


def test_serve_expose_names_an_unknown_value_and_the_accepted_ones(tmp_path):
    result = CliRunner().invoke(cli, _serve_args(tmp_path, "--expose", "ngrok"), env={"COLUMNS": "200"})
    assert result.exit_code == 2
    [line] = [line for line in result.output.splitlines() if "ngrok" in line]  # one line, wide enough
    assert (
        "--expose" in line and "unknown value 'ngrok'; choose one of none, direct, cloudflare, gradio" in line
    )


def test_public_url_goes_with_direct_only():
    with pytest.raises(ValueError, match="--public-url goes with --expose direct"):
        make_config(Path("/tmp"), expose="cloudflare", public_url="https://mine.example")


def test_expose_direct_public_url_reaches_info(tmp_path, no_e2b_key):
    config = make_config(tmp_path, expose="direct", public_url="https://tunnel.example:8300")
    with running_server(config) as server:
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        assert (info["expose"], info["public_url"]) == ("direct", "https://tunnel.example:8300/v1")
        assert server.server.tunnel is None


# -- gradio -----------------------------------------------------------------------------------------


@pytest.fixture
def gradio_share_server(tmp_path, monkeypatch):
    """A stand-in of Gradio's API server and of the frpc binary (see the module docstring)."""
    from gradio import networking, tunneling

    frps_port = free_port()  # where the stand-in API server says the share server is
    root_ca = "-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            requests.append(self.path)
            body = json.dumps([{"host": "127.0.0.1", "port": frps_port, "root_ca": root_ca}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    api = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    record = tmp_path / "frpc"
    frpc = stand_in_binary(tmp_path / "frpc_stand_in", record, FRPC_LOG, to="stdout", then="exec sleep 600")
    monkeypatch.setattr(
        networking, "GRADIO_API_SERVER", f"http://127.0.0.1:{api.server_port}/v3/tunnel-request"
    )
    monkeypatch.setattr(networking, "GRADIO_SHARE_SERVER_ADDRESS", None)
    monkeypatch.setattr(tunneling, "BINARY_PATH", str(frpc))
    monkeypatch.chdir(tmp_path)  # gradio writes the share server's certificate to ./.gradio/
    yield {"record": record, "frps_port": frps_port, "root_ca": root_ca, "requests": requests}
    api.shutdown()
    api.server_close()


def test_gradio_share_tunnel_url_is_the_public_url_and_the_tunnel_stops_with_the_server(
    tmp_path, gradio_share_server, no_e2b_key
):
    from gradio import tunneling

    config = make_config(tmp_path, expose="gradio")
    with running_server(config) as server:
        info = httpx.get(f"{server.url}/info", timeout=30).json()
        assert (info["expose"], info["public_url"]) == ("gradio", f"{SHARE_URL}/v1")
        assert server.server.manager.backend("e2b").proxy_url == SHARE_URL
        # gradio's Tunnel ran frpc against the share server its API server named, over TLS.
        argv = _argv(gradio_share_server["record"])
        assert argv[:2] == ["http", "-n"] and len(argv[2]) >= 32  # the share token
        assert argv[argv.index("-l") + 1] == str(config.capture_port)
        assert argv[argv.index("-i") + 1] == "127.0.0.1"
        assert argv[argv.index("--server_addr") + 1] == f"127.0.0.1:{gradio_share_server['frps_port']}"
        certificate = argv[argv.index("--tls_trusted_ca_file") + 1]
        assert Path(certificate).read_text() == gradio_share_server["root_ca"]
        assert gradio_share_server["requests"] == ["/v3/tunnel-request"]
        pid = _pid(gradio_share_server["record"])
        assert not _gone(pid)
    assert _gone(pid), "frpc still runs after the server stopped"
    assert all(t.share_token != argv[2] for t in tunneling.CURRENT_TUNNELS)


def test_serve_expose_gradio_offline_is_one_clear_line(tmp_path, monkeypatch, no_e2b_key):
    """Gradio's API server unreachable (offline): one line saying what it needs and what to use instead."""
    from gradio import networking

    monkeypatch.setattr(networking, "GRADIO_API_SERVER", f"http://127.0.0.1:{free_port()}/v3/tunnel-request")
    monkeypatch.setattr(networking, "GRADIO_SHARE_SERVER_ADDRESS", None)
    with pytest.raises(TunnelError) as caught:
        open_tunnel("gradio", "127.0.0.1", free_port())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "--expose gradio could not open Gradio's share tunnel (Could not get share link from Gradio API Server: "
    )
    assert "--expose direct --public-url URL" in message and "--inspector" in message

    result = CliRunner().invoke(cli, _serve_args(tmp_path, "--expose", "gradio"))
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "harbor serve cannot start: --expose gradio could not open Gradio's share tunnel" in output
    assert "Traceback" not in result.output
