"""opencode's command line, configuration, image layer and event-stream parsing.

data/opencode-events.jsonl is the real `opencode run --format json` output of opencode 1.18.33 in a
Docker sandbox against the vLLM imitation: a todowrite call with invalid arguments, an edit that
changed nothing (both reported as errors by opencode), a bash call, then the proxy's end-of-budget
message.
"""

from __future__ import annotations

import json
from pathlib import Path

from harnesses import AgentRun
from harnesses.assets import ASSETS_ENV, COMPLETE_MARKER
from harnesses.opencode import (
    BINARY,
    OFF_SANDBOX_TOOLS,
    OUTPUT_TOKEN_MAX,
    PROVIDER,
    VERSION,
    OpenCodeHarness,
    parse_events,
    platform_package,
    render_config,
)
from harnesses.tool_metrics import summarize

DATA = Path(__file__).parent / "data"


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix it",
        base_url="http://172.30.0.1:8300/v1",
        api_key="sess-key",
        model="tiny",
        step_limit=3,
    )
    return AgentRun(**(values | overrides))


def test_config_has_one_openai_compatible_provider_at_the_proxy() -> None:
    config = render_config(agent_run())
    provider = config["provider"][PROVIDER]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://172.30.0.1:8300/v1", "apiKey": "sess-key"}
    assert list(provider["models"]) == ["tiny"]
    assert config["model"] == config["small_model"] == f"{PROVIDER}/tiny"
    assert config["agent"]["build"]["steps"] == 3
    assert list(config["provider"]) == [PROVIDER]


def test_training_disables_tools_that_leave_the_sandbox_and_eval_keeps_them() -> None:
    train = render_config(agent_run(purpose="train"))
    assert train["tools"] == dict.fromkeys(OFF_SANDBOX_TOOLS, False)
    assert "webfetch" in OFF_SANDBOX_TOOLS
    assert "tools" not in render_config(agent_run(purpose="eval"))


def test_the_model_limit_fits_the_engines_context() -> None:
    # Without a limit opencode asks for 32,000 completion tokens a call: a 32,768-token engine refuses
    # every call once the prompt passes 768 tokens, so nothing is captured.
    models = render_config(agent_run(context_length=32768))["provider"][PROVIDER]["models"]
    assert models["tiny"]["limit"] == {"context": 32768, "output": 8192}
    small = render_config(agent_run(context_length=4096))["provider"][PROVIDER]["models"]["tiny"]
    assert small["limit"] == {"context": 4096, "output": 1024}
    huge = render_config(agent_run(context_length=1_000_000))["provider"][PROVIDER]["models"]["tiny"]
    assert huge["limit"]["output"] == OUTPUT_TOKEN_MAX  # never more than opencode's own default
    # The session's max_tokens cap, when lower, is what opencode asks for; context 0 means unknown.
    capped = render_config(agent_run(context_length=32768, max_tokens=256))["provider"][PROVIDER]
    assert capped["models"]["tiny"]["limit"] == {"context": 32768, "output": 256}
    only_cap = render_config(agent_run(max_tokens=512))["provider"][PROVIDER]["models"]["tiny"]
    assert only_cap["limit"] == {"context": 0, "output": 512}
    # Nothing known: opencode's own defaults, as before.
    assert "limit" not in render_config(agent_run())["provider"][PROVIDER]["models"]["tiny"]


def test_no_step_limit_sets_no_steps() -> None:
    assert "agent" not in render_config(agent_run(step_limit=0))


def test_command_and_environment() -> None:
    harness = OpenCodeHarness()
    run = agent_run()
    assert harness.command(run) == [BINARY, "run", "--format", "json", "--auto", "-m", f"{PROVIDER}/tiny"]
    env = harness.environment(run)
    assert json.loads(env["OPENCODE_CONFIG_CONTENT"]) == render_config(run)
    # start-up must not need the network, and a task's own opencode.json must not redirect the agent
    for flag in ("OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_PURE"):
        assert env[flag] == "1"
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"
    assert "sess-key" not in " ".join(v for k, v in env.items() if k != "OPENCODE_CONFIG_CONTENT")


def test_image_layer_copies_the_pinned_executable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    cached = tmp_path / f"{platform_package()}-{VERSION}"
    cached.mkdir()
    (cached / "opencode").write_bytes(b"#!/bin/sh\n")
    (cached / COMPLETE_MARKER).write_text("")
    layer = OpenCodeHarness().image_layer()
    assert layer.name == f"opencode-{VERSION}"
    assert layer.context_dir == cached
    assert layer.dockerfile_lines[0] == f"COPY opencode {BINARY}"


def test_events_give_tool_calls_failures_and_steps() -> None:
    summary = parse_events((DATA / "opencode-events.jsonl").read_text())
    metrics = summarize(summary.tool_results)
    assert metrics.calls_by_name == {"todowrite": 1, "edit": 1, "bash": 1}
    assert metrics.failures == 2
    assert summary.steps == 4
    assert summary.error is None
    assert "budget" in summary.text


def test_a_failed_bash_command_is_a_failure_even_when_the_tool_completed() -> None:
    event = {
        "type": "tool_use",
        "part": {
            "type": "tool",
            "tool": "bash",
            "state": {"status": "completed", "output": "no such file\n", "metadata": {"exit": 2}},
        },
    }
    summary = parse_events(json.dumps(event))
    assert summarize(summary.tool_results).failures == 1


def test_non_json_lines_are_skipped() -> None:
    assert parse_events("warning: something\n\n[1, 2]\n").tool_results == []


def test_an_error_event_is_a_harness_error() -> None:
    # Real output of opencode 1.18.33 when the endpoint refused its key.
    summary = parse_events((DATA / "opencode-api-error.jsonl").read_text())
    assert summary.error == "opencode reported an error: APIError: bad key (HTTP 401)"
    assert summary.tool_results == []


def test_the_real_opencode_asks_for_the_limit_it_is_given(tmp_path: Path) -> None:
    """The pinned opencode executable, run on this host against a stub endpoint that records the
    `max_tokens` of each call: 32,000 without a limit, the limit's output with one."""
    import http.server
    import os
    import subprocess
    import threading

    import pytest

    from harnesses import HarnessAssetError

    try:
        binary = OpenCodeHarness().image_layer().context_dir / "opencode"
    except HarnessAssetError as exc:
        pytest.skip(f"the opencode executable cannot be fetched here: {exc}")
    asked: list[int | None] = []

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            asked.append(body.get("max_tokens"))
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "refused", "type": "invalid_request_error"}}')

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    def max_tokens_asked(**limits) -> set[int | None]:
        asked.clear()
        run = agent_run(base_url=url, purpose="eval", step_limit=0, **limits)
        env = OpenCodeHarness().environment(run)
        state = tmp_path / f"state-{len(list(tmp_path.iterdir()))}"
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
            env[name] = str(state / name)
        (state / "work").mkdir(parents=True)
        subprocess.run(
            [str(binary), "run", "--format", "json", "--auto", "-m", f"{PROVIDER}/tiny"],
            input="Say hi", text=True, capture_output=True, timeout=120, cwd=state / "work",
            env={"PATH": os.environ["PATH"], "HOME": str(state), **env},
        )  # fmt: skip
        assert asked, "opencode made no model call"
        return set(asked)

    try:
        assert max_tokens_asked() == {OUTPUT_TOKEN_MAX}
        assert max_tokens_asked(context_length=32768) == {8192}
    finally:
        server.shutdown()
