"""Fixtures: each pinned vLLM release's own weight-transfer code and RL routes, served on 127.0.0.1
(tests/vllm/server.py). The release wheels are downloaded once per cache (tests/vllm/wheels.py)."""

from __future__ import annotations

import pytest

from tests.vllm.loader import load_release
from tests.vllm.server import VllmServer
from tests.vllm.wheels import RELEASES


@pytest.fixture(scope="session", params=RELEASES)
def release(request):
    return load_release(request.param)


@pytest.fixture(scope="session")
def vllm(release):
    server = VllmServer(release)
    with server.serve():
        yield server


@pytest.fixture
def engine(vllm):
    """A fresh engine behind the release's server (its weights as loaded, unpaused, tag "default")."""
    return vllm.fresh()
