"""claude-code's command line, environment, image layer and stream-json parsing.

data/claude-code-events.jsonl is the real `claude -p --output-format stream-json --verbose` output of
Claude Code 2.1.332 against the capture proxy in front of the vLLM imitation with `--max-turns 3`: a
Write call, a ReportFindings call it refused (is_error), a ToolSearch call, then its max-turns result.
"""

from __future__ import annotations

from pathlib import Path

from harnesses import AgentRun, get_harness
from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER
from harnesses.claude_code import (
    BINARY,
    OFF_SANDBOX_TOOLS,
    OFFLINE_ENV,
    VERSION,
    ClaudeCodeHarness,
    platform_package,
)
from harnesses.stream_json import parse_events
from harnesses.tool_metrics import summarize

DATA = Path(__file__).parent / "data"


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix it", base_url="http://172.30.0.1:8300/v1", api_key="sess-key", model="tiny"
    )
    return AgentRun(**(values | overrides))


def test_it_is_pointed_at_the_proxys_messages_api_with_the_session_key() -> None:
    env = ClaudeCodeHarness().environment(agent_run())
    assert env["ANTHROPIC_BASE_URL"] == "http://172.30.0.1:8300"  # the SDK adds /v1/messages
    assert env["ANTHROPIC_API_KEY"] == "sess-key"
    assert (
        env["ANTHROPIC_MODEL"]
        == env["ANTHROPIC_SMALL_FAST_MODEL"]
        == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"]
        == "tiny"
    )
    assert [k for k, v in env.items() if v == "sess-key"] == ["ANTHROPIC_API_KEY"]
    for name, value in OFFLINE_ENV.items():
        assert env[name] == value
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == env["DISABLE_TELEMETRY"] == "1"
    assert env["DISABLE_AUTOUPDATER"] == env["DISABLE_ERROR_REPORTING"] == "1"


def test_completion_size_follows_the_engines_context() -> None:
    harness = ClaudeCodeHarness()
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in harness.environment(agent_run())
    assert harness.environment(agent_run(context_length=32768))["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert (
        harness.environment(agent_run(context_length=32768, max_tokens=300))["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]
        == "300"
    )


def test_command_sets_the_turn_limit_and_training_disables_tools_that_leave_the_sandbox() -> None:
    harness = ClaudeCodeHarness()
    train = harness.command(agent_run(step_limit=3))
    assert train[:2] == [BINARY, "-p"] and "--dangerously-skip-permissions" in train
    assert train[train.index("--model") + 1] == "tiny"
    assert train[train.index("--max-turns") + 1] == "3"
    assert train[train.index("--disallowedTools") + 1] == ",".join(OFF_SANDBOX_TOOLS) == "WebFetch,WebSearch"
    assert train[train.index("--setting-sources") + 1] == "user"  # a task's .claude/ cannot redirect it
    evaluate = harness.command(agent_run(purpose="eval"))
    assert "--disallowedTools" not in evaluate and "--max-turns" not in evaluate


def test_image_layer_copies_the_pinned_executable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    cached = tmp_path / f"{platform_package().split('/')[-1]}-{VERSION}"
    cached.mkdir()
    (cached / "claude").write_bytes(b"#!/bin/sh\n")
    (cached / COMPLETE_MARKER).write_text("")
    layer = get_harness("claude-code").image_layer()
    assert layer.name == f"claude-code-{VERSION}" and layer.context_dir == cached
    assert layer.dockerfile_lines[0] == f"COPY claude {BINARY}"


def test_events_give_tool_calls_failures_and_the_turn_limit() -> None:
    summary = parse_events((DATA / "claude-code-events.jsonl").read_text(), "claude-code")
    metrics = summarize(summary.tool_results)
    assert metrics.calls_by_name == {"Write": 1, "ReportFindings": 1, "ToolSearch": 1}
    assert metrics.failures == 1
    assert summary.at_turn_limit and summary.error is None


def test_an_error_result_is_a_harness_error() -> None:
    line = '{"type": "result", "subtype": "success", "is_error": true, "num_turns": 1, "result": "API Error: 401 bad key"}'
    summary = parse_events(line + "\nnot json\n", "claude-code")
    assert summary.error == "claude-code reported an error: API Error: 401 bad key"
    assert not summary.at_turn_limit


def test_the_outcome_counts_the_tool_failures_of_the_event_log() -> None:
    from harnesses.agent_process import AgentProcess
    from sandboxes.base import ExecResult

    events = (DATA / "claude-code-events.jsonl").read_text()
    metrics = summarize(parse_events(events, "claude-code").tool_results)
    outcome = AgentProcess("claude-code", ExecResult(exit_code=0), False, events).outcome(metrics, None, "")
    assert outcome.tool_failures_by_name == {"ReportFindings": 1} and outcome.tool_failures == 1
