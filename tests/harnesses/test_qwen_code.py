"""qwen-code's command line, settings, environment and image layer; its stream-json events.

data/qwen-code-events.jsonl is the real `--output-format stream-json` output of Qwen Code 0.24.4 (on
Node 22.23.5) against the capture proxy in front of the vLLM imitation, stopped by
`--max-session-turns 3`: two edits and a read_file, each rejected (relative paths), and no closing result.
"""

from __future__ import annotations

from pathlib import Path

from harnesses import AgentRun
from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER, linux_machine
from harnesses.qwen_code import (
    CLI,
    NODE,
    NODE_VERSION,
    OFF_SANDBOX_TOOLS,
    VERSION,
    QwenCodeHarness,
    render_settings,
)
from harnesses.stream_json import parse_events
from harnesses.tool_metrics import summarize

DATA = Path(__file__).parent / "data"


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix it", base_url="http://172.30.0.1:8300/v1", api_key="sess-key", model="tiny"
    )
    return AgentRun(**(values | overrides))


def test_it_speaks_openai_chat_to_the_proxy_with_the_session_key() -> None:
    harness = QwenCodeHarness()
    env = harness.environment(agent_run())
    assert env["OPENAI_BASE_URL"] == "http://172.30.0.1:8300/v1" and env["OPENAI_API_KEY"] == "sess-key"
    assert env["QWEN_TELEMETRY_ENABLED"] == env["QWEN_USAGE_STATISTICS_ENABLED"] == "0"
    argv = harness.command(agent_run(step_limit=3))
    assert argv[:2] == [NODE, CLI] and argv[argv.index("--auth-type") + 1] == "openai"
    assert argv[argv.index("--max-session-turns") + 1] == "3" and "--yolo" in argv
    excluded = [argv[i + 1] for i, a in enumerate(argv) if a == "--exclude-tools"]
    assert excluded == list(OFF_SANDBOX_TOOLS) == ["web_fetch", "web_search"]
    assert "--exclude-tools" not in harness.command(agent_run(purpose="eval"))


def test_settings_turn_off_what_reaches_out_and_size_to_the_engine() -> None:
    settings = render_settings(agent_run(context_length=49152))
    assert settings["telemetry"] == {"enabled": False}
    assert settings["privacy"] == {"usageStatisticsEnabled": False}
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["model"]["generationConfig"]["contextWindowSize"] == 49152
    env = QwenCodeHarness().environment(agent_run(context_length=49152))
    assert env["QWEN_CODE_MAX_OUTPUT_TOKENS"] == "12288"
    assert "QWEN_CODE_MAX_OUTPUT_TOKENS" not in QwenCodeHarness().environment(agent_run())


def test_image_layer_copies_the_package_and_node(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    arch = "arm64" if linux_machine() == "aarch64" else "x64"
    cached = tmp_path / f"qwen-code-{VERSION}-node-{NODE_VERSION}-{arch}"
    cached.mkdir()
    (cached / COMPLETE_MARKER).write_text("")
    layer = QwenCodeHarness().image_layer()
    assert layer.name == f"qwen-code-{VERSION}" and layer.context_dir == cached
    assert layer.dockerfile_lines[0] == "COPY . /opt/harbor-rl/qwen-code/"


def test_events_give_tool_calls_and_failures() -> None:
    summary = parse_events((DATA / "qwen-code-events.jsonl").read_text(), "qwen-code")
    metrics = summarize(summary.tool_results)
    assert metrics.calls_by_name == {"edit": 2, "read_file": 1}
    assert metrics.failures == 2  # the two edits failed the same way: one distinct failure
    assert summary.error is None
