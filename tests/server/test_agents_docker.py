"""The real agents through `harbor serve`: mini-swe-agent and opencode in Docker sandboxes, their
calls captured, the verifier run, the trace fetched with the client.

The model is `engine.imitation`'s imitation of vLLM's OpenAI server (vLLM needs a GPU): its
"model" always calls one of the offered tools, so only the step limit stops the agent, and it never
solves the task (reward 0.0 with a valid trace is the expected outcome). Images are cached by content
hash, so only the first run pays for installing the agents.
"""

from __future__ import annotations

import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harbor_server.client import HarborSessionFactory
from tests.server.conftest import make_config, running_server
from tests.server.test_docker import docker_ready  # noqa: F401 - fixture

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]
MODEL = "tiny"
STEPS = 3


@pytest.fixture(scope="module")
def engine_url():
    with serve_in_thread(create_imitation_app(ImitationSettings(model=MODEL))) as url:
        yield url + "/v1"


@pytest.mark.parametrize("harness", ["mini-swe-agent", "opencode"])
def test_agent_through_the_server_in_docker(docker_ready, tmp_path, sandbox_root, engine_url, harness):  # noqa: F811
    config = make_config(tmp_path, sandbox="docker", capture_host="0.0.0.0", llm_url=engine_url, model=MODEL)
    with (
        running_server(config) as server,
        HarborSessionFactory(
            server.url, split="builtin", harness=harness, agent_timeout_sec=300, agent_step_limit=STEPS
        ) as factory,
    ):
        session = factory.create("fix-pagination", seed=1, episode_id=f"{harness}-0")
        verdict = session.verify()
        result = session.wait_for_completion()
        assert result.status == "completed", (result.error, result.agent_log_tail)
        assert verdict.env_reward == 0.0  # the verifier ran; the imitation does not solve tasks
        assert result.num_turns == STEPS  # the step limit is the session's model-call budget
        assert sum(result.tool_calls_by_name.values()) >= 1, result.agent_log_tail
        trace = session.fetch_training_trace()  # validated: a FATAL finding would raise
        assert len(trace.turns) == STEPS and trace.multi_step_task
        assert any(turn.trainable for turn in trace.turns)
        for turn in trace.turns:
            assert len(turn.per_token_logps) == len(turn.completion_token_ids) > 0


def test_opencode_against_the_embedded_tiny_engine_is_captured(docker_ready, tmp_path, sandbox_root):  # noqa: F811
    """README's Docker set-up with harness="opencode": the embedded tiny engine (random weights, its
    own context), not the imitation. Left to itself opencode asks for 32,000 completion tokens a call,
    which an engine refuses when prompt + 32,000 exceed its context, and nothing is captured; told the
    engine's max_model_len, it asks for a quarter of it."""
    from engine.server import EngineConfig, create_app

    # opencode's own prompt (system text and its ten tools) is about 10k tokens: a context that holds it and
    # a quarter for the answer, smaller than `harbor engine`'s 32k so a random model's answers stay short.
    context = 16384
    engine = create_app(EngineConfig(model="tiny", max_model_len=context, return_tokens_as_token_ids=True))
    with serve_in_thread(engine) as url:
        config = make_config(
            tmp_path, sandbox="docker", capture_host="0.0.0.0", llm_url=url + "/v1", model=MODEL
        )
        with (
            running_server(config) as server,
            HarborSessionFactory(
                server.url, split="builtin", harness="opencode", agent_timeout_sec=600, agent_step_limit=2
            ) as factory,
        ):
            session = factory.create("fix-pagination", seed=1, episode_id="opencode-tiny")
            session.verify()
            result = session.wait_for_completion()
            assert result.num_turns > 0, (result.error, result.agent_log_tail)
            trace = session.fetch_training_trace()
    assert len(trace.turns) == result.num_turns
    for turn in trace.turns:
        assert turn.metadata.sampling.get("max_tokens") == context // 4, turn.metadata.sampling
        assert 0 < len(turn.completion_token_ids) <= context // 4
