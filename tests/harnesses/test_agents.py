"""The real agents in real sandboxes (Docker, and local bubblewrap), their calls captured by the real proxy.

The model is the vLLM imitation (see conftest): it always calls a tool, so an agent never finishes on
its own and only its step limit stops it; that is what these tests rely on. Images are built once per
pinned version (cached by content hash), so only the first run pays for the install. opencode also runs
in the local backend; mini-swe-agent there would pip-install its layer at every start (a minute or more
on two cores), too slow for the suite.
"""

from __future__ import annotations

import pytest

from engine.imitation import chat_prompt_ids
from harnesses import AgentOutcome, AgentRun, get_harness

from .conftest import MODEL, Capture, builtin_task, rollout_name

pytestmark = pytest.mark.slow


async def run_rollout(
    harness_name: str,
    capture: Capture,
    backend,
    *,
    step_limit: int,
    proxy_budget: int,
    timeout_s: float = 240,
) -> tuple[AgentOutcome, dict]:
    """One rollout of a built-in task: session, sandbox with the harness layer, agent; returns outcome + session."""
    harness = get_harness(harness_name)
    task = builtin_task()
    spec = task.sandbox_spec(rollout_name(harness_name), proxy_port=capture.port)
    spec = spec.model_copy(update={"image_layers": [harness.image_layer()]})
    session = capture.create_session(max_model_calls=proxy_budget)
    sandbox = await backend.start(spec)
    try:
        outcome = await harness.run(
            sandbox,
            AgentRun(
                instruction=task.instruction,
                base_url=f"http://{sandbox.proxy_host}:{capture.port}/v1",
                api_key=session["api_key"],
                model=MODEL,
                workdir=spec.workdir,
                timeout_s=timeout_s,
                step_limit=step_limit,
            ),
        )
    finally:
        await sandbox.stop()
    return outcome, capture.session(session["session_id"])


def captured_turns(capture: Capture, session_id: str, expected: int) -> list[dict]:
    """The session's validated trace: `expected` turns whose ids are the ones the engine computed."""
    reply = capture.trace(session_id)
    assert reply.status_code == 200, reply.text
    turns = reply.json()["turns"]
    assert len(turns) == expected
    for turn in turns:
        request = turn["request"]
        # the imitation's prompt ids are its chat template over exactly the messages the agent sent
        assert turn["prompt_token_ids"] == chat_prompt_ids(request["messages"], request.get("tools"))
        assert turn["completion_token_ids"]
        assert len(turn["per_token_logps"]) == len(turn["completion_token_ids"])
        assert len(turn["loss_mask"]) == len(turn["prompt_token_ids"]) + len(turn["completion_token_ids"])
    return turns


def offered_tools(turn: dict) -> list[str]:
    return [tool["function"]["name"] for tool in turn["request"].get("tools") or []]


@pytest.mark.docker
async def test_mini_swe_agent_stops_at_its_step_limit_and_is_captured(
    capture: Capture, docker_backend
) -> None:
    outcome, session = await run_rollout(
        "mini-swe-agent", capture, docker_backend, step_limit=3, proxy_budget=0
    )

    assert outcome.error is None, outcome.log_tail
    assert not outcome.timed_out
    assert "LimitsExceeded" in outcome.log_tail
    assert session["num_turns"] == 3
    assert outcome.tool_calls_by_name == {"bash": 3}
    turns = captured_turns(capture, session["session_id"], 3)
    assert all(offered_tools(turn) == ["bash"] for turn in turns)
    assert not any(turn["metadata"]["streamed"] for turn in turns)


async def test_opencode_runs_until_the_proxy_budget_and_is_captured(capture: Capture, backend) -> None:
    outcome, session = await run_rollout("opencode", capture, backend, step_limit=3, proxy_budget=3)

    assert not outcome.timed_out, outcome.log_tail
    assert session["num_turns"] == 3  # the budget's calls were answered and recorded; later ones were not
    assert sum(outcome.tool_calls_by_name.values()) >= 1, outcome.log_tail
    turns = captured_turns(capture, session["session_id"], 3)
    assert all(turn["metadata"]["streamed"] for turn in turns)  # opencode streams every call
    agent_turns = [turn for turn in turns if offered_tools(turn)]
    assert agent_turns, "opencode offered no tools in any call"
    for turn in agent_turns:
        assert "bash" in offered_tools(turn)
        assert "webfetch" not in offered_tools(turn)  # training disables tools that leave the sandbox
