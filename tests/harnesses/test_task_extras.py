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
import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.imitation import ImitationSettings, create_imitation_app
from engine.in_process import serve_in_thread
from harnesses import AgentRun, HarnessConfigError, get_harness
from harnesses.claude_code import render_mcp_config
from harnesses.codex import render_config as codex_config
from harnesses.mcp import mcp_servers
from harnesses.mini_swe_agent import MiniSweAgentHarness, task_text
from harnesses.opencode import render_config as opencode_config
from harnesses.qwen_code import render_settings
from tests.harbor_ref.venv import run_in_harbor

from .conftest import MODEL, Capture, builtin_task, rollout_name

DATA = Path(__file__).parent / "data"
PROBE_SERVER = DATA / "mcp_probe_server.py"
PROBE_TOOL = "harbor_probe_"
"""The probe server's tools: `harbor_probe_http` and `harbor_probe_stdio`."""
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


async def test_a_missing_skills_dir_copies_nothing_and_is_logged_once(local_backend, caplog) -> None:
    from harnesses.skills import copy_skills

    sandbox = await local_backend.start(builtin_task().sandbox_spec(rollout_name("skills")))
    try:
        run = agent_run(skills_dir="/no/such/skills")
        with caplog.at_level(logging.WARNING, logger="harnesses.skills"):
            for _ in range(2):
                await copy_skills(sandbox, run, "/tmp/agent-skills")
        created = await sandbox.exec(["test", "-e", "/tmp/agent-skills"])
    finally:
        await sandbox.stop()
    assert [record.getMessage() for record in caplog.records] == [
        "skills_dir /no/such/skills is not a folder in the sandbox; no skills were copied"
    ]
    assert created.exit_code == 1


def test_no_servers_change_nothing() -> None:
    run = agent_run()
    assert task_text(run) == "Fix it."
    assert "mcp" not in opencode_config(run) and "mcpServers" not in render_settings(run)
    assert "mcp_servers" not in tomllib.loads(codex_config(run, mcp_servers(run, "codex", headers=True)))


# -- the real agents in Docker ---------------------------------------------------------------------

SKILLS_DIR = "/task-skills"
SKILL_NAME = "harbor-probe-skill"
SKILL_MARK = "harbor-skill-desc-91c2"
SKILL = (
    f"---\nname: {SKILL_NAME}\ndescription: Probe skill {SKILL_MARK} for harness tests.\n---\nDo nothing.\n"
)
SERVER_IN_SANDBOX = "/opt/probe/server.py"
PROBE_LOG = "/tmp/mcp-probe.log"
MCP_TOOL_NAMES = {
    "claude-code": ["mcp__probe__harbor_probe_http", "mcp__local__harbor_probe_stdio"],  # deferred
    "codex": ["harbor_probe_http", "harbor_probe_stdio"],  # in namespaces, which the proxy flattens
    "opencode": ["probe_harbor_probe_http", "local_harbor_probe_stdio"],
    "qwen-code": ["mcp__probe__harbor_probe_http", "mcp__local__harbor_probe_stdio"],  # deferred
}
"""How each agent names the servers' tools to the model, as the engine sees them."""
HEADERS_SENT = {"claude-code": True, "codex": True, "opencode": False, "qwen-code": False}


class ForceProbeTool:
    """The imitation behind an ASGI wrapper that makes its "model" call the MCP probe's tools, each
    transport's in turn, whenever a chat request offers them: directly, or (Claude Code, Qwen Code) through
    the agent's tool search, for tools it defers and names only in the prompt. The imitation otherwise
    picks a tool by a hash of the prompt, with arguments built from its schema."""

    def __init__(self, app) -> None:
        self.app = app
        self.forced = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        body = self._forced(body)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        delivered = False

        async def replay():
            nonlocal delivered
            if delivered:
                return await receive()  # the client's disconnect, when it comes
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": headers}, replay, send)

    def _forced(self, body: bytes) -> bytes:
        request = json.loads(body or b"null")
        settings = self.app.state.settings
        settings.tool_arguments = None  # arguments from the tool's schema, unless set below
        if not isinstance(request, dict) or not request.get("tools"):
            return body
        names = [(tool.get("function") or {}).get("name", "") for tool in request["tools"]]
        offered = sorted(name for name in names if PROBE_TOOL in name)
        deferred = sorted(set(re.findall(rf"mcp__\w+?__{PROBE_TOOL}\w+", json.dumps(request["messages"]))))
        if offered:
            self.forced += 1
            choice = offered[self.forced % len(offered)]
        elif deferred and "ToolSearch" in names:  # Claude Code loads deferred tools by a search
            choice = "ToolSearch"
            settings.tool_arguments = json.dumps({"query": f"select:{','.join(deferred)}", "max_results": 5})
        elif deferred and "tool_call" in names:  # Qwen Code calls a deferred tool through tool_call
            self.forced += 1
            choice = "tool_call"
            settings.tool_arguments = json.dumps(
                {"name": deferred[self.forced % len(deferred)], "arguments": {}}
            )
        else:
            return body
        return json.dumps(
            {**request, "tool_choice": {"type": "function", "function": {"name": choice}}}
        ).encode()


@pytest.fixture(scope="module")
def imitation_url() -> Iterator[str]:
    """Overrides conftest's: the capture proxy's model is the imitation that calls the MCP tools."""
    with serve_in_thread(ForceProbeTool(create_imitation_app(ImitationSettings(model=MODEL)))) as url:
        yield url


async def start_probe_server(sandbox) -> None:
    """The probe MCP server inside the sandbox: its file for stdio, and a streamable-HTTP one listening."""
    await sandbox.upload_file(PROBE_SERVER, SERVER_IN_SANDBOX)
    await sandbox.upload_file(SKILL.encode(), f"{SKILLS_DIR}/{SKILL_NAME}/SKILL.md")
    start = (
        f"chmod -R a+rX /opt/probe {SKILLS_DIR} && touch {PROBE_LOG} && chmod 666 {PROBE_LOG} && "
        f"(setsid nohup python3 {SERVER_IN_SANDBOX} http 8765 > /tmp/probe-http.txt 2>&1 < /dev/null &) && "
        "for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8765) 2>/dev/null && exit; sleep 0.1; done; exit 1"
    )
    started = await sandbox.exec(["bash", "-c", start], user="root", timeout_s=60)
    assert started.ok, started.stdout + started.stderr


def offered_tools(turn: dict) -> list[str]:
    return [(tool.get("function") or {}).get("name", "") for tool in turn["request"].get("tools") or []]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("harness", "user"),
    [("claude-code", None), ("opencode", None), ("codex", None), ("qwen-code", None), ("codex", "nobody")],
)
async def test_the_agent_offers_the_tasks_skills_and_calls_its_mcp_servers(
    harness: str, user: str | None, capture: Capture, docker_backend, monkeypatch
) -> None:
    """`user`: the task's [agent] user (codex keeps its state under /opt, where only root may write)."""
    from harnesses import claude_code, codex, opencode, qwen_code
    from sandboxes import with_default_user

    skills_folder = {
        "claude-code": claude_code.SKILLS_DIR,
        "opencode": opencode.SKILLS_DIR,
        "codex": codex.SKILLS_DIR,
        "qwen-code": qwen_code.SKILLS_DIR,
    }[harness]
    config_file = {
        "claude-code": claude_code.USER_CONFIG,
        "codex": f"{codex.CODEX_HOME}/config.toml",
        "qwen-code": f"{qwen_code.QWEN_HOME}/settings.json",
    }.get(harness)  # opencode's config is OPENCODE_CONFIG_CONTENT, not a file
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    agent = get_harness(harness)
    task = builtin_task()
    spec = task.sandbox_spec(rollout_name(harness), proxy_port=capture.port)
    session = capture.create_session(max_model_calls=4)
    sandbox = await docker_backend.start(spec.model_copy(update={"image_layers": [agent.image_layer()]}))
    try:
        await start_probe_server(sandbox)
        servers = (SERVERS if HEADERS_SENT[harness] else PLAIN)[:2]  # the http and stdio probes
        run = AgentRun(
            instruction=task.instruction,
            base_url=f"http://{sandbox.proxy_host}:{capture.port}/v1",
            api_key=session["api_key"],
            model=MODEL,
            workdir=spec.workdir,
            timeout_s=300,
            skills_dir=SKILLS_DIR,
            mcp_servers=servers,
        )
        outcome = await agent.run(with_default_user(sandbox, user), run)
        copied = await sandbox.exec(["cat", f"{skills_folder}/{SKILL_NAME}/SKILL.md"])
        owner = await sandbox.exec(["stat", "-c", "%U", skills_folder])
        config = (await sandbox.download_file(config_file)).decode() if config_file else None
        probe_log = (await sandbox.download_file(PROBE_LOG)).decode()
    finally:
        await sandbox.stop()

    assert not outcome.timed_out, outcome.log_tail
    assert copied.stdout == SKILL, copied.stderr  # copied where the agent reads skills
    assert owner.stdout.strip() == (user or "root")  # by the agent's user, as Harbor copies them
    if harness == "claude-code":
        assert set(json.loads(config)["mcpServers"]) == {"probe", "local"}
    elif harness == "codex":
        assert set(tomllib.loads(config)["mcp_servers"]) == {"probe", "local"}
    elif harness == "qwen-code":
        assert json.loads(config)["mcpServers"]["probe"] == {"httpUrl": SERVERS[0]["url"]}
    turns = capture.trace(session["session_id"]).json()["turns"]
    agent_turns = [turn for turn in turns if offered_tools(turn)]
    assert agent_turns, outcome.log_tail
    first = json.dumps(agent_turns[0]["request"])
    for name in MCP_TOOL_NAMES[harness]:  # one per transport, offered or (Claude Code) deferred by name
        assert name in first, (offered_tools(agent_turns[0]), probe_log, outcome.log_tail)
    assert SKILL_MARK in first, "the agent did not offer the task's skill"
    # the forced call reached an MCP server, and its reply went back to the model
    for transport in ("http", "stdio"):
        assert f"{transport} call {PROBE_TOOL}{transport}" in probe_log, (probe_log, outcome.log_tail)
    assert any(PROBE_REPLY in json.dumps(turn["request"]["messages"]) for turn in turns), outcome.log_tail
    assert "stdio method tools/list" in probe_log and "http method tools/list" in probe_log, probe_log
    if HEADERS_SENT[harness]:
        assert '"x-probe-token": "Bearer s3cret"' in probe_log and '"x-probe-region": "eu-1"' in probe_log
