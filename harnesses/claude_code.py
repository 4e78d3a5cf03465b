"""`claude-code`: Anthropic's Claude Code (npm `@anthropic-ai/claude-code`, pinned), run unchanged in
print mode against the capture proxy's Messages API.

Install: `@anthropic-ai/claude-code` is a thin npm wrapper whose postinstall picks a per-platform
package holding one self-contained executable (no Node needed). The host fetches that package with
`npm pack` (`harnesses.assets`) and the image layer copies the executable to /opt/harbor-rl/claude-code.

Run: `claude -p --output-format stream-json --verbose --dangerously-skip-permissions --model <model>`
with the instruction on stdin. ANTHROPIC_BASE_URL is the proxy (the SDK adds `/v1/messages`) and
ANTHROPIC_API_KEY the session key (sent as `x-api-key`); every model alias (the small fast model for
side calls too) names the session's model. Nothing else is reached: telemetry, error reporting, the
auto-updater, feedback surveys, feature flags and other non-essential traffic are off by environment,
only the user settings of an empty config folder are read (a task's own `.claude/settings.json`
cannot redirect the agent), and train runs disallow WebFetch and WebSearch. Claude Code asks for
32,000 completion tokens a call unless CLAUDE_CODE_MAX_OUTPUT_TOKENS says otherwise, which is sized to
the engine's context as for opencode. `--max-turns` is the step limit, and the proxy's budget backs
it. Tool counts come from the stream-json events it prints.

Task extras, as Harbor hands them over (`harbor/agents/installed/claude_code.py`): the task's skills_dir is
copied into `$CLAUDE_CONFIG_DIR/skills/`, and its MCP servers go into `$CLAUDE_CONFIG_DIR/.claude.json`
as user-scoped `mcpServers` (loaded without a trust prompt), header values by `${VAR}` reference to the
exec environment.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from harnesses._common import LOG_DIR, completion_budget
from harnesses.agent_process import AgentFiles, run_agent
from harnesses.assets import ensure_asset, linux_machine, npm_files
from harnesses.base import AgentOutcome, AgentRun
from harnesses.mcp import McpServers, mcp_servers
from harnesses.stream_json import parse_events
from harnesses.tool_metrics import summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from sandboxes.base import Sandbox

VERSION = "2.1.332"
INSTALL_DIR = "/opt/harbor-rl/claude-code"
BINARY = f"{INSTALL_DIR}/claude"
EVENTS_LOG = f"{LOG_DIR}/claude-code.jsonl"
STDERR_LOG = f"{LOG_DIR}/claude-code.stderr.txt"
STATE_DIR = "/tmp/harbor-rl-claude-code"
"""CLAUDE_CONFIG_DIR: its settings, session transcripts and caches live here, not in the task's HOME."""
SKILLS_DIR = f"{STATE_DIR}/skills"
"""Claude Code's user skills folder, `$CLAUDE_CONFIG_DIR/skills/`."""
USER_CONFIG = f"{STATE_DIR}/.claude.json"
"""Its global config, where user-scoped MCP servers live."""
FILES = AgentFiles(EVENTS_LOG, STDERR_LOG, f"{STATE_DIR}/instruction.md", STATE_DIR)
OFF_SANDBOX_TOOLS = ("WebFetch", "WebSearch")
OUTPUT_TOKEN_MAX = 32_000
"""Claude Code's completion size when CLAUDE_CODE_MAX_OUTPUT_TOKENS is not set."""
MODEL_ALIASES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
)
OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_FEATURE_FLAGS": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
}
"""Everything Claude Code would reach besides the model, switched off."""


class ClaudeCodeHarness:
    name = "claude-code"

    def __init__(self, *, version: str = VERSION) -> None:
        self.version = version

    def image_layer(self) -> ImageLayer:
        """The pinned executable from the host cache (fetched with `npm pack` on first use)."""
        package = platform_package()
        spec = f"{package}@{self.version}"
        key = f"{package.split('/')[-1]}-{self.version}"  # claude-code-linux-x64-<version>
        assets = ensure_asset(key, lambda folder: npm_files(spec, folder, {"package/claude": "claude"}))
        return ImageLayer(
            name=f"claude-code-{self.version}",
            dockerfile_lines=[f"COPY claude {BINARY}", f"RUN chmod 0755 {BINARY} && {BINARY} --version"],
            context_dir=assets,
        )

    def command(self, run: AgentRun) -> list[str]:
        """The agent's argv; the instruction goes in on stdin."""
        argv = [
            BINARY, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
            "--model", run.model, "--setting-sources", "user", "--no-session-persistence",
        ]  # fmt: skip
        if run.step_limit > 0:
            argv += ["--max-turns", str(run.step_limit)]
        if run.purpose == "train":
            argv += ["--disallowedTools", ",".join(OFF_SANDBOX_TOOLS)]
        return argv

    def environment(self, run: AgentRun) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": run.base_url.removesuffix("/").removesuffix("/v1"),
            "ANTHROPIC_API_KEY": run.api_key,
            **dict.fromkeys(MODEL_ALIASES, run.model),
            **OFFLINE_ENV,
            "CLAUDE_CONFIG_DIR": STATE_DIR,
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions is refused as root elsewhere
            "NO_COLOR": "1",
            "TERM": "dumb",
        }
        budget = completion_budget(run.context_length, run.max_tokens, OUTPUT_TOKEN_MAX)
        if budget is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(budget)
        return env

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        servers = mcp_servers(run, self.name, headers=True)
        config = {USER_CONFIG: json.dumps(render_mcp_config(servers)).encode()} if servers.servers else {}
        env = {**self.environment(run), **servers.env}
        process = await run_agent(
            sandbox, run, self.name, self.command(run), env, FILES, config, skills_folder=SKILLS_DIR
        )
        if process.events is None:
            return process.without_log()
        summary = parse_events(process.events, self.name)
        return process.outcome(
            summarize(summary.tool_results),
            summary.error,
            f"{summary.text}\n[turns: {summary.turns}]",
            stopped_at_limit=summary.at_turn_limit,
        )


def platform_package() -> str:
    """The npm package holding Claude Code's executable for this host (glibc Linux, like the sandboxes)."""
    return (
        "@anthropic-ai/claude-code-linux-arm64"
        if linux_machine() == "aarch64"
        else "@anthropic-ai/claude-code-linux-x64"
    )


def render_mcp_config(servers: McpServers) -> dict[str, Any]:
    """`.claude.json`'s `mcpServers`, as Harbor writes them
    (`harbor/agents/installed/claude_code.py:1902-1935`): stdio servers by command and args, HTTP ones by
    type (`streamable-http` is Claude Code's `http`) and URL, each header a `${VAR}` that Claude Code
    expands from its environment."""
    entries: dict[str, dict[str, Any]] = {}
    for server in servers.servers:
        if server.transport == "stdio":
            entries[server.name] = {"type": "stdio", "command": server.command, "args": server.args}
            continue
        kind = "http" if server.transport == "streamable-http" else server.transport
        entry: dict[str, Any] = {"type": kind, "url": server.url}
        if server.name in servers.header_refs:
            entry["headers"] = {name: f"${{{var}}}" for name, var in servers.header_refs[server.name].items()}
        entries[server.name] = entry
    return {"mcpServers": entries}
