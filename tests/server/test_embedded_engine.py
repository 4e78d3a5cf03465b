"""The whole coding path on the embedded default: `harbor engine`'s tiny model (served in-process by
the real engine app), `harbor serve`, Docker sandboxes, the real agents, the client.

The tiny random model cannot solve a task: a completed rollout with reward 0.0 and a trace that
validates is the expected outcome; the oracle through the same server scores 1.0.
"""

from __future__ import annotations

import pytest

from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from tests.server.conftest import make_config, running_server
from tests.server.test_docker import docker_ready  # noqa: F401 - fixture

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def engine_url():
    from engine.server import EngineConfig, create_app

    config = EngineConfig(model="tiny", return_tokens_as_token_ids=True, num_threads=1)
    with serve_in_thread(create_app(config)) as url:
        yield url + "/v1"


@pytest.fixture
def server(docker_ready, tmp_path, sandbox_root, engine_url):  # noqa: F811
    config = make_config(
        tmp_path,
        sandbox="docker",
        capture_host="0.0.0.0",
        llm_url=engine_url,
        model="tiny",
        check_engine=True,
    )
    with running_server(config) as thread:
        yield thread


def test_start_up_probe_accepts_the_embedded_engine(server):
    engine = server.server.engine
    assert engine.ok and engine.token_ids and engine.logprobs and engine.processed_logprobs


@pytest.mark.parametrize("harness", ["mini-swe-agent", "opencode"])
def test_agent_on_the_tiny_model(server, harness):
    with HarborSessionFactory(
        server.url, split="builtin", harness=harness, agent_timeout_sec=300, agent_step_limit=3,
        sampling={"temperature": 1.0, "max_tokens": 48},
    ) as factory:  # fmt: skip
        session = factory.create("fix-pagination", seed=0, episode_id=harness)
        result = session.wait_for_completion()
        assert result.status == "completed", (result.error, result.agent_log_tail)
        assert session.verify().env_reward == 0.0
        trace = session.fetch_training_trace()
        assert 1 <= len(trace.turns) == result.num_turns <= 3
        assert any(turn.trainable for turn in trace.turns)
        for turn in trace.turns:
            assert turn.metadata.capture == "ok"
            assert len(turn.completion_token_ids) == len(turn.per_token_logps) <= 48


def test_oracle_on_the_same_server(server):
    with HarborSessionFactory(server.url, split="builtin", harness="oracle") as factory:
        assert factory.create("fix-pagination").verify().env_reward == 1.0
