"""Fixtures: a real proxy (uvicorn on 127.0.0.1, random port) in front of the vLLM imitation.

The upstream is `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM
itself needs a GPU); the store is a real SQLite trace store; agents are the real `openai` client.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.models import SessionCreated
from capture_proxy.service import CaptureService
from capture_proxy.store import TraceStore
from engine.imitation import create_imitation_app
from engine.in_process import serve_in_thread

ADMIN_KEY = "test-admin-key-0123456789"
MODEL = "imitation-model"


@dataclass
class Imitation:
    url: str

    def configure(self, **settings) -> None:
        httpx.post(f"{self.url}/imitation/settings", json=settings).raise_for_status()

    def requests(self) -> list[dict]:
        return httpx.get(f"{self.url}/imitation/requests").json()

    def direct(self, path: str, body: dict) -> dict:
        """The same call made straight to the engine, with the fields the proxy adds."""
        r = httpx.post(f"{self.url}/v1/{path}", json=body)
        r.raise_for_status()
        return r.json()


@dataclass
class Proxy:
    url: str
    service: CaptureService
    store: TraceStore

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}

    def create(self, **spec) -> SessionCreated:
        spec.setdefault("model", MODEL)
        r = httpx.post(f"{self.url}/sessions", json=spec, headers=self.admin)
        assert r.status_code == 201, r.text
        return SessionCreated.model_validate(r.json())


@pytest.fixture
def imitation():
    with serve_in_thread(create_imitation_app()) as url:
        yield Imitation(url)


@pytest.fixture
def store(tmp_path):
    s = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    yield s
    s.close()


def start_proxy(imitation: Imitation, store: TraceStore, **config):
    cfg = ProxyConfig(upstream_url=imitation.url, admin_key=ADMIN_KEY, **config)
    app = create_app(cfg, store)
    return app, serve_in_thread(app)


@pytest.fixture
def proxy(imitation, store):
    app, server = start_proxy(imitation, store)
    with server as url:
        yield Proxy(url, app.state.service, store)
