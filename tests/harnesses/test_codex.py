"""codex's config, command line, image layer, and the parsing of its rollout and JSON events.

data/codex-rollout.jsonl holds the `response_item` lines of a real session rollout of codex 0.171.0
against the capture proxy in front of the vLLM imitation (a namespaced close_agent call and a
request_user_input call, each refused by codex); data/codex-api-error.jsonl is its real `exec --json`
output when the endpoint answered 400.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from harnesses import AgentRun
from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER, linux_machine
from harnesses.codex import (
    BINARY,
    CODEX_HOME,
    KEY_ENV,
    PROVIDER,
    VERSION,
    CodexHarness,
    parse_events,
    parse_rollout,
    render_config,
)
from harnesses.tool_metrics import summarize

DATA = Path(__file__).parent / "data"


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix it", base_url="http://172.30.0.1:8300/v1", api_key="sess-key", model="tiny"
    )
    return AgentRun(**(values | overrides))


def test_config_has_one_responses_provider_at_the_proxy_and_nothing_that_reaches_out() -> None:
    config = tomllib.loads(render_config(agent_run(context_length=32768)))
    assert config["model"] == "tiny" and config["model_provider"] == PROVIDER
    assert config["model_providers"] == {
        PROVIDER: {
            "name": "Harbor capture proxy",
            "base_url": "http://172.30.0.1:8300/v1",
            "env_key": KEY_ENV,
            "wire_api": "responses",
            "request_max_retries": 0,
        }
    }
    assert config["check_for_update_on_startup"] is False
    assert config["web_search"] == "disabled"
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["model_context_window"] == 32768
    assert "model_context_window" not in tomllib.loads(render_config(agent_run()))
    assert "sess-key" not in render_config(agent_run())  # the key travels in the environment only


def test_command_and_environment() -> None:
    harness = CodexHarness()
    argv = harness.command(agent_run())
    assert argv[:2] == [BINARY, "exec"] and argv[-1] == "-"
    assert "--json" in argv and "--dangerously-bypass-approvals-and-sandbox" in argv
    env = harness.environment(agent_run())
    assert env[KEY_ENV] == "sess-key" and env["CODEX_HOME"] == CODEX_HOME


def test_image_layer_copies_the_pinned_executable_and_ripgrep(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    arch = "arm64" if linux_machine() == "aarch64" else "x64"
    cached = tmp_path / f"codex-linux-{arch}-{VERSION}"
    cached.mkdir()
    (cached / COMPLETE_MARKER).write_text("")
    layer = CodexHarness().image_layer()
    assert layer.name == f"codex-{VERSION}" and layer.context_dir == cached
    assert layer.dockerfile_lines[0] == "COPY codex rg /opt/harbor-rl/codex/"


def test_the_rollout_gives_every_tool_call_by_name() -> None:
    metrics = summarize(parse_rollout((DATA / "codex-rollout.jsonl").read_text()))
    assert metrics.calls_by_name == {"close_agent": 1, "request_user_input": 1}
    assert metrics.failures == 1  # "invalid agent id ... Error(...)"; the other output names no error


def test_a_failed_turn_is_a_harness_error() -> None:
    summary = parse_events((DATA / "codex-api-error.jsonl").read_text())
    assert (
        summary.error is not None
        and "logged" in summary.error
        and summary.error.startswith("codex reported an error")
    )


def test_a_reply_cut_at_the_token_limit_ends_the_run_without_a_harness_error() -> None:
    # codex's own words when the stream ends with response.incomplete (max_output_tokens)
    line = (
        '{"type":"turn.failed","error":{"message":"Incomplete response returned, reason: max_output_tokens"}}'
    )
    summary = parse_events(line)
    assert summary.truncated and summary.error is None
