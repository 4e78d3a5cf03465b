"""Fixtures: the real embedded engine (uvicorn on 127.0.0.1, random port) serving the tiny model.

Everything is real: the tiny model built on the spot, the batching loop, HTTP, the `openai` client.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch

from engine.in_process import serve_in_thread
from engine.server import EngineConfig, create_app
from engine.tiny_model import build_tiny_model, load_model_and_tokenizer

MAX_MODEL_LEN = 1024


def serve(app) -> AbstractContextManager[str]:
    """Run an ASGI app with uvicorn on a background thread; yields its base URL (no /v1)."""
    return serve_in_thread(app, start_timeout_s=60, log_level="warning")


def engine_app(model_dir: Path, **overrides):
    config = EngineConfig(
        model=str(model_dir),
        served_model_name="tiny",
        max_model_len=MAX_MODEL_LEN,
        num_threads=1,
        **overrides,
    )
    return create_app(config)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(seed=0, cache_dir=tmp_path_factory.mktemp("harbor-cache"))


@pytest.fixture(scope="session")
def reference(tiny_dir):
    """A separate copy of the tiny model, for recomputing logprobs with a plain forward pass."""
    torch.set_num_threads(1)
    return load_model_and_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def engine(tiny_dir):
    """Engine shared by read-only tests (its weights never change)."""
    app = engine_app(tiny_dir)
    with serve(app) as url:
        yield Engine(url, app)


@pytest.fixture
def fresh_engine(tiny_dir):
    """An engine of its own, for tests that change weights or pause it."""
    app = engine_app(tiny_dir)
    with serve(app) as url:
        yield Engine(url, app)


class Engine:
    def __init__(self, url: str, app) -> None:
        self.url = url
        self.app = app

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    @property
    def scheduler(self):
        return self.app.state.engine.scheduler
