"""A task's skills_dir and MCP servers, handed to each agent as Harbor hands them (docs/design.md 3.8).

Three kinds of check:
- the config each harness renders holds the task's MCP servers exactly as Harbor's own installed agent
  renders them (Harbor's package, in its venv, is the judge), and what Harbor refuses is refused here;
- mini-swe-agent refuses a skills_dir with one line, and lists the servers in its task text as Harbor does;
- the real agents in Docker sandboxes, against the capture proxy: the skills are copied where the agent
  reads them and it offers them to the model, the config file in the sandbox holds the servers, and the
  agent lists the MCP tool of each transport (a tiny stdlib MCP server inside the sandbox, stdio and
  streamable HTTP), calls it, and sends its reply back to the model. The vLLM imitation is made to call
  the MCP tool (tool_choice) whenever the agent offers it.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from harnesses import AgentRun, HarnessConfigError, get_harness
from harnesses.claude_code import render_mcp_config
from harnesses.codex import render_config as codex_config
from harnesses.mcp import mcp_servers
from harnesses.mini_swe_agent import MiniSweAgentHarness, task_text
from harnesses.opencode import render_config as opencode_config
from harnesses.qwen_code import render_settings
from tests.harbor_ref.venv import run_in_harbor

DATA = Path(__file__).parent / "data"
PROBE_SERVER = DATA / "mcp_probe_server.py"
PROBE_TOOL = "harbor_probe"
PROBE_REPLY = "harbor-probe-reply-7f3a"
TOKEN_ENV = "HARBOR_TEST_PROBE_TOKEN"
HEADERS = {"X-Probe-Token": f"Bearer ${{{TOKEN_ENV}}}", "X-Probe-Region": "${HARBOR_TEST_UNSET:-eu}-1"}
SERVERS = [
    {"name": "probe", "transport": "streamable-http", "url": "http://127.0.0.1:8765/mcp", "headers": HEADERS},
    {"name": "local", "transport": "stdio", "command": "python3", "args": ["/opt/probe/server.py", "stdio"]},
    {"name": "old", "transport": "sse", "url": "http://127.0.0.1:8766/sse"},
]
PLAIN = [{k: v for k, v in server.items() if k != "headers"} for server in SERVERS]
"""The servers without headers, for the agents that cannot send them."""


def agent_run(**overrides) -> AgentRun:
    values = dict(
        instruction="Fix it.", base_url="http://172.30.0.1:8300/v1", api_key="sess-key", model="tiny"
    )
    return AgentRun(**(values | overrides))


def _same_names(config: object) -> object:
    """Header variables named alike: Harbor's `MCP_AUTH_<uuid>_<i>_<j>`, ours `HARBOR_MCP_AUTH_<i>_<j>`."""
    text = re.sub(
        r"(?:HARBOR_)?MCP_AUTH_(?:[0-9A-F]{32}_)?(\d+)_(\d+)", r"MCP_AUTH_\1_\2", json.dumps(config)
    )
    return json.loads(text)


def test_each_agents_mcp_config_is_the_one_harbor_writes(monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    harbor = json.loads(
        run_in_harbor(
            str(DATA / "harbor_agent_configs.py"), json.dumps({"servers": SERVERS, "instruction": "Fix it."})
        )
    )
    full, plain = agent_run(mcp_servers=SERVERS), agent_run(mcp_servers=PLAIN)
    ours = {
        "claude-code": render_mcp_config(mcp_servers(full, "claude-code", headers=True)),
        "codex": tomllib.loads(codex_config(full, mcp_servers(full, "codex", headers=True)))["mcp_servers"],
        "qwen-code": render_settings(plain)["mcpServers"],
        "opencode": opencode_config(plain)["mcp"],
        "mini-swe-agent": task_text(plain),
    }
    assert _same_names(ours) == _same_names(harbor)


def test_header_values_travel_in_the_exec_environment_only(monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    monkeypatch.delenv("HARBOR_TEST_UNSET", raising=False)
    servers = mcp_servers(agent_run(mcp_servers=SERVERS), "codex", headers=True)
    assert servers.header_refs == {
        "probe": {"X-Probe-Token": "HARBOR_MCP_AUTH_0_0", "X-Probe-Region": "HARBOR_MCP_AUTH_0_1"}
    }
    assert servers.env == {"HARBOR_MCP_AUTH_0_0": "Bearer s3cret", "HARBOR_MCP_AUTH_0_1": "eu-1"}
    run = agent_run(mcp_servers=SERVERS)
    assert "s3cret" not in codex_config(run, servers)
    assert "s3cret" not in json.dumps(render_mcp_config(mcp_servers(run, "claude-code", headers=True)))
    assert get_harness("codex").environment(run).get("HARBOR_MCP_AUTH_0_0") is None  # added only at run time


def test_an_unset_header_variable_is_one_line_naming_it(monkeypatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(HarnessConfigError) as caught:
        mcp_servers(agent_run(mcp_servers=SERVERS), "claude-code", headers=True)
    assert str(caught.value) == (
        f"MCP server 'probe' header 'X-Probe-Token' = '${{{TOKEN_ENV}}}': {TOKEN_ENV} is not set on this host; "
        "export it first"
    )


@pytest.mark.parametrize("harness", ["opencode", "qwen-code", "mini-swe-agent"])
async def test_agents_that_cannot_send_headers_refuse_a_server_with_headers(harness: str) -> None:
    with pytest.raises(HarnessConfigError) as caught:
        await get_harness(harness).run(None, agent_run(mcp_servers=SERVERS))  # refused before the sandbox
    assert str(caught.value) == (
        f"{harness} cannot send HTTP headers to MCP server 'probe' (Harbor refuses this too); "
        "use claude-code or codex, or a server without headers"
    )


def test_a_malformed_server_is_one_line() -> None:
    with pytest.raises(HarnessConfigError, match=r"^MCP server 'x': .*'url' is required"):
        mcp_servers(agent_run(mcp_servers=[{"name": "x", "transport": "sse"}]), "codex", headers=True)


async def test_mini_swe_agent_refuses_skills_with_one_line() -> None:
    with pytest.raises(HarnessConfigError) as caught:
        await MiniSweAgentHarness().run(None, agent_run(skills_dir="/skills"))
    assert str(caught.value) == (
        "mini-swe-agent does not support skills (the task sets [environment] skills_dir); "
        "use claude-code, opencode, codex or qwen-code"
    )


def test_no_servers_change_nothing() -> None:
    run = agent_run()
    assert task_text(run) == "Fix it."
    assert "mcp" not in opencode_config(run) and "mcpServers" not in render_settings(run)
    assert "mcp_servers" not in tomllib.loads(codex_config(run, mcp_servers(run, "codex", headers=True)))
