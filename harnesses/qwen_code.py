"""`qwen-code`: Qwen Code (npm `@qwen-code/qwen-code`, pinned), run unchanged in headless mode against the
capture proxy's OpenAI-compatible chat API.

Install: the npm package is a self-contained Node bundle (no dependencies to resolve, ripgrep vendored)
that needs Node >= 22, which sandbox images lack; the host fetches it and Node's own Linux build (npm
`node-linux-<arch>`, pinned) with `npm pack` (`harnesses.assets`), and the image layer copies both to
/opt/harbor-rl/qwen-code.

Run: `node cli.js --auth-type openai -m <model> --yolo --output-format stream-json` with the instruction
on stdin; OPENAI_BASE_URL and OPENAI_API_KEY are the proxy and the session key. Configured through the
user settings in its own QWEN_HOME: telemetry and usage statistics off (also by environment), no
auto-update, no chat recording, the engine's context as the model's context window. Train runs exclude
the tools that leave the sandbox (web_fetch, web_search). The completion size goes into
QWEN_CODE_MAX_OUTPUT_TOKENS, sized to the engine's context as for opencode (it otherwise asks for the
model's declared limit, 32,000 for an unknown model). `--max-session-turns` is the step limit, backed
by the proxy's budget. Tool counts come from the stream-json events it prints (Claude Code's shape).

Task extras, as Harbor hands them over (`harbor/agents/installed/qwen_code.py`): the task's skills_dir is
copied into `$QWEN_HOME/skills/` (Harbor's `~/.qwen/skills/`; QWEN_HOME is where Qwen Code keeps its
global settings and skills), and its MCP servers become `mcpServers` of the user settings. Qwen Code
sends no headers, so a server with headers is refused, as Harbor does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from harnesses._common import LOG_DIR, completion_budget
from harnesses.agent_process import AgentFiles, run_agent
from harnesses.assets import ensure_asset, linux_machine, npm_files, npm_pack, unpack
from harnesses.base import AgentOutcome, AgentRun
from harnesses.mcp import McpServers, mcp_servers
from harnesses.stream_json import parse_events
from harnesses.tool_metrics import summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from pathlib import Path

    from sandboxes.base import Sandbox

VERSION = "0.24.4"
NODE_VERSION = "22.23.5"
"""Node's release line the package asks for (`engines.node` >= 22)."""
INSTALL_DIR = "/opt/harbor-rl/qwen-code"
NODE = f"{INSTALL_DIR}/node"
CLI = f"{INSTALL_DIR}/package/cli.js"
EVENTS_LOG = f"{LOG_DIR}/qwen-code.jsonl"
STDERR_LOG = f"{LOG_DIR}/qwen-code.stderr.txt"
QWEN_HOME = "/tmp/harbor-rl-qwen-code"
FILES = AgentFiles(EVENTS_LOG, STDERR_LOG, f"{QWEN_HOME}/instruction.md", QWEN_HOME)
SKILLS_DIR = f"{QWEN_HOME}/skills"
OFF_SANDBOX_TOOLS = ("web_fetch", "web_search")
OUTPUT_TOKEN_MAX = 32_000
TURN_LIMIT_EXIT = 53
"""Its exit code when `--max-session-turns` stopped it: the step limit, not a failure."""


class QwenCodeHarness:
    name = "qwen-code"

    def __init__(self, *, version: str = VERSION, node_version: str = NODE_VERSION) -> None:
        self.version = version
        self.node_version = node_version

    def image_layer(self) -> ImageLayer:
        """The pinned package and Node from the host cache (fetched with `npm pack` on first use)."""
        arch = "arm64" if linux_machine() == "aarch64" else "x64"
        assets = ensure_asset(
            f"qwen-code-{self.version}-node-{self.node_version}-{arch}",
            lambda folder: self._fetch(arch, folder),
        )
        return ImageLayer(
            name=f"qwen-code-{self.version}",
            dockerfile_lines=[
                f"COPY . {INSTALL_DIR}/",
                # npm's tarball keeps the vendored ripgrep without its execute bit.
                f"RUN chmod 0755 {NODE} {INSTALL_DIR}/package/vendor/ripgrep/*-linux/rg && {NODE} {CLI} --version",
            ],
            context_dir=assets,
        )

    def _fetch(self, arch: str, folder: Path) -> None:
        npm_files(f"node-linux-{arch}@{self.node_version}", folder, {"package/bin/node": "node"})
        tarball = npm_pack(f"@qwen-code/qwen-code@{self.version}", folder)
        try:
            unpack(tarball, folder)
        finally:
            tarball.unlink()

    def command(self, run: AgentRun) -> list[str]:
        argv = [
            NODE,
            CLI,
            "--auth-type",
            "openai",
            "-m",
            run.model,
            "--yolo",
            "--output-format",
            "stream-json",
        ]
        if run.step_limit > 0:
            argv += ["--max-session-turns", str(run.step_limit)]
        if run.purpose == "train":
            for tool in OFF_SANDBOX_TOOLS:
                argv += ["--exclude-tools", tool]
        return argv

    def environment(self, run: AgentRun) -> dict[str, str]:
        env = {
            "OPENAI_BASE_URL": run.base_url,
            "OPENAI_API_KEY": run.api_key,
            "OPENAI_MODEL": run.model,
            "QWEN_HOME": QWEN_HOME,
            "QWEN_TELEMETRY_ENABLED": "0",
            "QWEN_USAGE_STATISTICS_ENABLED": "0",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }
        budget = completion_budget(run.context_length, run.max_tokens, OUTPUT_TOKEN_MAX)
        if budget is not None:
            env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(budget)
        return env

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        settings = {f"{QWEN_HOME}/settings.json": json.dumps(render_settings(run)).encode()}
        argv, env = self.command(run), self.environment(run)
        process = await run_agent(
            sandbox, run, self.name, argv, env, FILES, settings, skills_folder=SKILLS_DIR
        )
        if process.events is None:
            return process.without_log()
        summary = parse_events(process.events, self.name)
        return process.outcome(
            summarize(summary.tool_results),
            summary.error,
            summary.text,
            stopped_at_limit=process.result.exit_code == TURN_LIMIT_EXIT,
        )


def render_settings(run: AgentRun) -> dict[str, Any]:
    """Qwen Code's user settings: nothing reported or updated, the engine's context when known."""
    settings: dict[str, Any] = {
        "general": {"enableAutoUpdate": False, "chatRecording": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    if run.context_length:
        settings["model"] = {"generationConfig": {"contextWindowSize": run.context_length}}
    servers = mcp_servers(run, "qwen-code", headers=False)
    if servers.servers:
        settings["mcpServers"] = mcp_settings(servers)
    return settings


def mcp_settings(servers: McpServers) -> dict[str, Any]:
    """`mcpServers`, as Harbor writes them (`harbor/agents/installed/qwen_code.py:668-684`): stdio by command
    and args, streamable HTTP by `httpUrl`, SSE by `url`."""
    entries: dict[str, Any] = {}
    for server in servers.servers:
        if server.transport == "stdio":
            entries[server.name] = {"command": server.command, "args": server.args}
        elif server.transport == "streamable-http":
            entries[server.name] = {"httpUrl": server.url}
        else:
            entries[server.name] = {"url": server.url}
    return entries
