"""Fixtures: the tiny model (built once per session) and the real embedded engine over uvicorn."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.tiny_model import build_tiny_model, load_model_and_tokenizer
from tests.engine.conftest import Engine, engine_app, serve
from tests.proxy.conftest import imitation, proxy, store  # noqa: F401 (the proxy fixtures, for test_versions)


@pytest.fixture(scope="session", autouse=True)
def _few_threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.fixture
def tiny_model(tiny_dir):
    model, tokenizer = load_model_and_tokenizer(tiny_dir)
    return model, tokenizer


@pytest.fixture
def fresh_engine(tiny_dir):
    app = engine_app(tiny_dir)
    with serve(app) as url:
        yield Engine(url, app)
