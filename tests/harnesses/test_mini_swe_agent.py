"""mini-swe-agent's command line, environment, image layer and trajectory parsing.

The trajectories under data/ were written by the real mini-swe-agent 2.4.6 against a local OpenAI
imitation: one stopped by its step limit (one command failing twice), one where the model kept calling
an unknown tool (RepeatedFormatError), one where the key was refused (AuthenticationError).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnesses import AgentRun
from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER
from harnesses.mini_swe_agent import (
    BINARY,
    LITELLM_VERSION,
    OPENAI_VERSION,
    TRAJECTORY,
    VERSION,
    MiniSweAgentHarness,
    parse_trajectory,
    soft_time_limit,
)
from harnesses.tool_metrics import summarize

DATA = Path(__file__).parent / "data"


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix the bug.\n-- and mind the dash",
        base_url="http://172.30.0.1:8300/v1",
        api_key="sess-key",
        model="Qwen/Qwen3-8B",
        step_limit=3,
        timeout_s=600,
    )
    return AgentRun(**(values | overrides))


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_command_line_is_the_documented_one_with_limits_in_config() -> None:
    argv = MiniSweAgentHarness().command(agent_run())
    assert argv[:9] == [
        BINARY, "--yolo", "--model", "openai/Qwen/Qwen3-8B", "--task", "Fix the bug.\n-- and mind the dash",
        "--cost-limit", "0", "--exit-immediately",
    ]  # fmt: skip
    assert argv[argv.index("--output") + 1] == TRAJECTORY
    configs = [argv[i + 1] for i, word in enumerate(argv) if word == "-c"]
    assert configs[0] == "mini.yaml"  # any -c replaces the default config, so it is named first
    assert "agent.step_limit=3" in configs
    assert f"agent.wall_time_limit_seconds={soft_time_limit(600)}" in configs
    assert "environment.cwd=/app" in configs


def test_soft_time_limit_stays_under_the_hard_one_and_is_never_zero() -> None:
    assert soft_time_limit(600) < 600
    assert soft_time_limit(5) == 1  # 0 would mean "no limit" to mini-swe-agent


def test_environment_points_at_the_proxy_with_only_the_session_key() -> None:
    env = MiniSweAgentHarness().environment(agent_run())
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://172.30.0.1:8300/v1"
    assert env["OPENAI_API_KEY"] == "sess-key"
    assert env["MSWEA_CONFIGURED"] == "true"  # no interactive first-run set-up
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors"


def test_image_layer_installs_pinned_wheels_from_the_host_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    name = f"mini-swe-agent-{VERSION}-litellm-{LITELLM_VERSION}-openai-{OPENAI_VERSION}"
    cached = tmp_path / f"{name}-cp311"
    (cached / "wheels").mkdir(parents=True)
    (cached / COMPLETE_MARKER).write_text("")  # already fetched: no network needed
    layer = MiniSweAgentHarness().image_layer()
    assert layer.name == name
    assert layer.context_dir == cached
    script = "\n".join(layer.dockerfile_lines)
    assert script.startswith("COPY wheels/ ")
    assert "--no-index" in script and f"'mini-swe-agent=={VERSION}'" in script
    assert f"'litellm=={LITELLM_VERSION}'" in script  # the model client is pinned too
    assert f"'openai=={OPENAI_VERSION}'" in script
    assert "venv --without-pip /opt/harbor-rl/mini-swe-agent" in script


def test_trajectory_stopped_by_the_step_limit() -> None:
    summary = parse_trajectory(load("mini-swe-agent-step-limit.traj.json"))
    assert summary.exit_status == "LimitsExceeded"
    assert summary.api_calls == 3
    assert summary.error is None
    metrics = summarize(summary.tool_results)
    assert metrics.calls_by_name == {"bash": 3}
    assert metrics.failures == 1  # `ls /nonexistent` failed twice with the same output


def test_trajectory_with_rejected_tool_calls() -> None:
    summary = parse_trajectory(load("mini-swe-agent-format-errors.traj.json"))
    assert summary.exit_status == "RepeatedFormatError"
    assert summary.error is None  # the agent's own exit, not a harness failure
    metrics = summarize(summary.tool_results)
    assert metrics.calls_by_name == {"python": 3}
    assert metrics.failures == 1


def test_trajectory_ending_on_an_exception_reports_an_error() -> None:
    summary = parse_trajectory(load("mini-swe-agent-auth-error.traj.json"))
    assert summary.exit_status == "AuthenticationError"
    assert summary.error is not None and "AuthenticationError" in summary.error
    assert summarize(summary.tool_results).calls_by_name == {}


@pytest.mark.parametrize("data", [{}, {"messages": [], "info": {}}])
def test_an_empty_trajectory_has_no_calls(data: dict) -> None:
    summary = parse_trajectory(data)
    assert summary.tool_results == [] and summary.error is None
