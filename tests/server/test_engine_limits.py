"""What a harness is told about the engine's limits: the context length the engine reports in
GET /v1/models (vLLM's and `harbor engine`'s `max_model_len`) and the session's max_tokens cap, so an
agent that asks for a fixed completion size (opencode: 32,000 tokens) can be kept inside the context."""

from __future__ import annotations

import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from harbor_server.engine_check import model_context_length
from tests.server.conftest import make_config, running_server
from tests.server.scripted import SERVER_KWARGS, RecorderHarness

pytestmark = pytest.mark.timeout(300)
MODEL = "imitation-model"


def test_the_harness_gets_the_engines_context_length_and_the_sessions_cap(tmp_path, sandbox_root):
    RecorderHarness.runs.clear()
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as engine:
        config = make_config(tmp_path, llm_url=engine + "/v1", model=MODEL)
        with (
            running_server(config, **SERVER_KWARGS) as server,
            HarborSessionFactory(
                server.url, split="builtin", harness="recorder", sandbox="local", sampling={"max_tokens": 256}
            ) as factory,  # fmt: skip
        ):
            for i in range(2):
                factory.create(0, seed=i).wait_for_completion(timeout_s=200)
    assert [(r.context_length, r.max_tokens) for r in RecorderHarness.runs] == [(32768, 256)] * 2


def test_an_engine_that_reports_no_context_length_gives_none():
    hosted = {"object": "list", "data": [{"id": "gpt-x", "object": "model"}]}
    assert model_context_length(hosted, "gpt-x") is None
    vllm = {"data": [{"id": "other", "max_model_len": 4096}, {"id": "m", "max_model_len": 8192}]}
    assert model_context_length(vllm, "m") == 8192 and model_context_length(vllm, "absent") is None
