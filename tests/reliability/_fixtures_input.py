"""Fixtures of the bad-input, load and isolation tests: a real capture proxy (uvicorn on 127.0.0.1)
in front of `engine.imitation`, a faithful local imitation of vLLM's OpenAI server (vLLM itself
needs a GPU), with a real SQLite trace store (the `store` fixture of conftest.py). Test modules import the fixtures
they use from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from capture_proxy.app import create_app
from capture_proxy.config import ProxyConfig
from capture_proxy.store import TraceStore
from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from tests.proxy.conftest import ADMIN_KEY, MODEL, Imitation, Proxy

__all__ = ["ADMIN_KEY", "MODEL", "Imitation", "Proxy", "imitation", "live_proxy", "serving_proxy"]


@pytest.fixture
def imitation() -> Iterator[Imitation]:
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as url:
        yield Imitation(url)


@contextmanager
def serving_proxy(engine_url: str, store: TraceStore) -> Iterator[Proxy]:
    """The standalone proxy (agent + admin routes) in front of the engine at `engine_url`."""
    app = create_app(ProxyConfig(upstream_url=engine_url, admin_key=ADMIN_KEY), store)
    with serve_in_thread(app) as url:
        yield Proxy(url, app.state.service, store)


@pytest.fixture
def live_proxy(imitation, store) -> Iterator[Proxy]:
    """The standalone proxy (agent + admin routes) in front of the imitation."""
    with serving_proxy(imitation.url, store) as proxy:
        yield proxy
