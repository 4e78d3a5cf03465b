"""claude-code, codex and qwen-code in Docker sandboxes, their calls captured by the real proxy.

Two runs each. Against the vLLM imitation (see conftest; it always calls a tool, so only a limit stops
the agent) the harness alone: the agent's own binary, pointed at the proxy in its own API (Anthropic
Messages, OpenAI Responses, OpenAI chat), every call captured with the ids the engine computed. Then
through `harbor serve` with the embedded tiny engine, as a user runs it: a built-in task, the verifier
(reward 0.0 from a random model), and a trace that validates. Real agents' prompts are long (Claude
Code's first is about 17k tokens of the tiny tokenizer), so the engine gets a context that holds them.
The serve runs are eval sessions: a random model's first reply seldom calls a tool, so an agent may stop
after one call, and a train capture of a multi-step task that holds one call is refused by design
(`degenerate_rollout`, docs/design.md 3.1).
"""

from __future__ import annotations

import os

import pytest

from engine.imitation import chat_prompt_ids
from tests.harnesses.test_agents import captured_turns, run_rollout
from tests.server.conftest import make_config, running_server, sandbox_root  # noqa: F401 - fixture

from .conftest import Capture

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1500)]

DIALECTS = {"claude-code": "anthropic-messages", "codex": "openai-responses", "qwen-code": None}
CONTEXT = {"claude-code": 32768, "codex": 32768, "qwen-code": 49152}
"""The tiny engine's context per agent: its first prompt plus the quarter each harness asks for."""


@pytest.mark.parametrize("harness", ["claude-code", "codex", "qwen-code"])
async def test_agent_in_docker_is_captured_in_its_own_dialect(
    harness: str, capture: Capture, docker_backend
) -> None:
    outcome, session = await run_rollout(harness, capture, docker_backend, step_limit=3, proxy_budget=3)

    assert outcome.error is None, outcome.log_tail
    assert not outcome.timed_out, outcome.log_tail
    assert session["num_turns"] == 3
    assert sum(outcome.tool_calls_by_name.values()) >= 1, outcome.log_tail
    turns = captured_turns(capture, session["session_id"], 3)
    assert {turn["metadata"].get("dialect") for turn in turns} == {DIALECTS[harness]}
    for turn in turns:
        # the engine's ids are its chat template over the translated request, exactly
        assert turn["prompt_token_ids"] == chat_prompt_ids(
            turn["request"]["messages"], turn["request"].get("tools")
        )
    # each call extends the last one: the agent's own history replayed as the engine wrote it
    assert [turn["metadata"]["parent_node_id"] for turn in turns[1:]] == [t["node_id"] for t in turns[:-1]]


QWEN_CODE_ON_THE_TINY_ENGINE = pytest.param(
    "qwen-code",
    marks=pytest.mark.skipif(
        not os.environ.get("HARBOR_TEST_LONG_AGENTS"),
        reason="qwen-code's 25k-token prompt takes ~7 min on the CPU engine; its Docker capture is tested "
        "above (set HARBOR_TEST_LONG_AGENTS=1 to run it through harbor serve too)",
    ),
)
"""Kept out of CI's time budget: the run above already captures qwen-code in Docker with the engine's
ids; this one adds only the tiny engine's slowness on its prompt."""


@pytest.mark.parametrize("harness", ["claude-code", "codex", QWEN_CODE_ON_THE_TINY_ENGINE])
def test_agent_through_harbor_serve_with_the_embedded_engine(
    harness: str,
    docker_ready,
    tmp_path,
    sandbox_root,  # noqa: F811 - the fixture
) -> None:
    from engine.in_process import serve_in_thread
    from engine.server import EngineConfig, create_app
    from harbor_server.client import HarborSessionFactory

    engine = create_app(
        EngineConfig(model="tiny", max_model_len=CONTEXT[harness], return_tokens_as_token_ids=True)
    )
    with serve_in_thread(engine, start_timeout_s=120) as url:
        config = make_config(
            tmp_path, sandbox="docker", capture_host="0.0.0.0", llm_url=url + "/v1", model="tiny"
        )
        with (
            running_server(config) as server,
            HarborSessionFactory(
                server.url,
                split="builtin",
                harness=harness,
                agent_timeout_sec=900,
                agent_step_limit=2,
                purpose="eval",
            ) as factory,
        ):
            session = factory.create("fix-pagination", seed=1, episode_id=f"{harness}-tiny")
            verdict = session.verify()
            result = session.wait_for_completion()
            assert result.num_turns > 0, (result.error, result.agent_log_tail)
            trace = session.fetch_training_trace()  # validated: a FATAL finding would raise
    assert verdict.env_reward == 0.0, (result.error, result.agent_log_tail)
    assert len(trace.turns) == result.num_turns
    for turn in trace.turns:
        assert turn.metadata.capture == "ok"
        assert len(turn.per_token_logps) == len(turn.completion_token_ids) > 0
        assert (turn.metadata.model_extra or {}).get("dialect") == DIALECTS[harness]
