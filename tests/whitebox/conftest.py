"""Fixtures for the white-box path: a real capture proxy (uvicorn on 127.0.0.1) with a real SQLite
store, in front of either the vLLM imitation (`engine.imitation`, a faithful local imitation of
vLLM's wire protocol, which needs a GPU here) or the real embedded engine serving the tiny model.
Model calls are made by the real `openai` client.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from capture_proxy.validation import validate_trace
from engine.imitation import create_imitation_app
from engine.in_process import serve_in_thread

ADMIN_KEY = "whitebox-admin-key-0123"


@dataclass
class Imitation:
    url: str

    def configure(self, **settings) -> None:
        httpx.post(f"{self.url}/imitation/settings", json=settings).raise_for_status()


@dataclass
class Session:
    session_id: str
    base_url: str
    api_key: str
    clients: list = field(default_factory=list)

    def client(self) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)
        self.clients.append(client)
        return client


@dataclass
class Proxy:
    url: str
    store: TraceStore

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}

    def session(self, llm_url: str, model: str, **spec) -> Session:
        body = {"llm_url": llm_url, "model": model, **spec}
        r = httpx.post(f"{self.url}/sessions", json=body, headers=self.admin)
        assert r.status_code == 201, r.text
        created = r.json()
        return Session(created["session_id"], created["base_url"], created["api_key"])

    def trace(self, session_id: str) -> dict:
        """The stored trace, checked by the proxy's own validator: no FATAL finding."""
        r = httpx.get(f"{self.url}/sessions/{session_id}/trace", headers=self.admin)
        assert r.status_code == 200, r.text
        trace = r.json()
        fatal = [f for f in validate_trace(trace) if f.severity == "FATAL"]
        assert fatal == []
        return trace


@pytest.fixture
def imitation() -> Iterator[Imitation]:
    with serve_in_thread(create_imitation_app()) as url:
        yield Imitation(url)


@pytest.fixture
def proxy(tmp_path) -> Iterator[Proxy]:
    store = TraceStore(f"sqlite:///{tmp_path}/traces.db")
    app = create_app(ProxyConfig(admin_key=ADMIN_KEY), store)
    with serve_in_thread(app) as url:
        yield Proxy(url, store)
    store.close()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from engine.tiny_model import build_tiny_model

    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


def serve_engine(model_dir: Path, max_model_len: int = 2048):
    """The real embedded engine serving `model_dir` on a background uvicorn (context manager)."""
    from engine.server import EngineConfig
    from engine.server import create_app as create_engine_app

    config = EngineConfig(
        model=str(model_dir), served_model_name="tiny", max_model_len=max_model_len, num_threads=1
    )
    return serve_in_thread(create_engine_app(config))


def assert_masks_train_only_model_tokens(trace: dict) -> None:
    """Every turn: prompt positions (which hold the tool results) are 0; completion positions are the
    engine's sampled tokens, each with a logprob."""
    for turn in trace["turns"]:
        n_prompt, n_completion = len(turn["prompt_token_ids"]), len(turn["completion_token_ids"])
        assert len(turn["loss_mask"]) == n_prompt + n_completion
        assert set(turn["loss_mask"][:n_prompt]) <= {0}
        assert len(turn["per_token_logps"]) == n_completion
        if turn["metadata"]["role"] == "agent":
            assert turn["loss_mask"][n_prompt:] == [1] * n_completion


# The sandbox backends (local: bubblewrap; docker: the real engine, marked `docker`), shared with
# the sandbox tests so the coding environment runs on each backend that can run here.
from tests.sandboxes.conftest import (  # noqa: E402, F401
    backend,
    base_image,
    docker_backend,
    docker_client,
    local_backend,
    no_leftover_containers,
)
