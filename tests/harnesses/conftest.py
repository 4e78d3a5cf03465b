"""Fixtures for the harness tests: the vLLM imitation as the model, a real capture proxy in front of it,
and the real Docker engine for sandboxes.

The model is `engine.imitation`'s imitation of vLLM's OpenAI server (no GPU here): a faithful
local imitation of the wire protocol (token ids, logprobs, hermes tool calls, streaming) whose "model"
always calls one of the offered tools. Everything else is real: the capture proxy app and its SQLite
trace store served over HTTP on 127.0.0.1, the agents' own packages, Docker containers.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread

MODEL = "tiny"
ADMIN_KEY = "harness-tests-admin-key"
BASE_IMAGE = "harbor-rl/sandbox-base:bookworm"


@dataclass
class Capture:
    """A running capture proxy: where it listens and how to manage its sessions."""

    url: str
    port: int

    def create_session(self, *, max_model_calls: int = 0, purpose: str = "train") -> dict:
        body = {
            "model": MODEL,
            "max_model_calls": max_model_calls,
            "purpose": purpose,
            "multi_step_task": True,
        }
        reply = httpx.post(f"{self.url}/sessions", json=body, headers=_admin(), timeout=30)
        reply.raise_for_status()
        return reply.json()

    def session(self, session_id: str) -> dict:
        reply = httpx.get(f"{self.url}/sessions/{session_id}", headers=_admin(), timeout=30)
        reply.raise_for_status()
        return reply.json()

    def trace(self, session_id: str) -> httpx.Response:
        return httpx.get(f"{self.url}/sessions/{session_id}/trace", headers=_admin(), timeout=30)


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def imitation_url() -> Iterator[str]:
    # The tool called is picked by a hash of the prompt, and Claude Code's prompt holds today's date: on
    # some days it was ToolSearch, whose deferred tools then change every later request's tool list.
    settings = ImitationSettings(model=MODEL, excluded_tools=["ToolSearch"])
    with serve_in_thread(create_imitation_app(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def capture(imitation_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    """The capture proxy on 127.0.0.1; Docker sandboxes reach it through the backend's forwarder."""
    db = tmp_path_factory.mktemp("capture") / "traces.db"
    store = TraceStore(f"sqlite:///{db}")
    app = create_app(ProxyConfig(upstream_url=imitation_url, admin_key=ADMIN_KEY), store, close_store=True)
    with serve_in_thread(app) as url:
        yield Capture(url=url, port=int(url.rsplit(":", 1)[1]))


def docker_client_or_skip():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no daemon"
        pytest.skip(f"Docker engine not reachable: {exc}")
    return client


@pytest.fixture(scope="module")
def docker_ready() -> None:
    client = docker_client_or_skip()
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"{BASE_IMAGE} is not built (docker/sandbox-base/build.sh)")


@pytest.fixture
async def docker_backend(docker_ready):
    """One backend per test: its proxy forwarder runs on the test's own event loop."""
    from sandboxes.docker import DockerBackend

    backend = DockerBackend()
    yield backend
    await backend.aclose()


@pytest.fixture
def local_backend(tmp_path: Path):
    from sandboxes.local import LocalBackend

    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed; the local sandbox needs it to give tasks their /app")
    return LocalBackend(root=tmp_path / "sandboxes", isolation="bwrap")


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker), "local"])
def backend(request: pytest.FixtureRequest):
    """Each sandbox backend that can build a harness's image layer here."""
    return request.getfixturevalue(f"{request.param}_backend")


def rollout_name(harness: str) -> str:
    return f"test-{harness}-{uuid.uuid4().hex[:8]}"


def builtin_task(name: str = "fix-pagination"):
    from tasks import load_dataset_spec

    return load_dataset_spec("builtin").get(name)


REPO = Path(__file__).resolve().parents[2]
