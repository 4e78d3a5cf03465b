"""`opencode`: the opencode coding agent (npm `opencode-ai`, pinned), run unchanged in `run` mode.

Install: `opencode-ai` is a thin npm wrapper whose postinstall picks a per-platform package holding
one self-contained executable (Bun-compiled, no Node needed). The host fetches that package with
`npm pack` (`harnesses.assets`) and the image layer copies the executable to /opt/harbor-rl/opencode.

Run: `opencode run --format json --auto -m harbor/<model> < instruction.md`, configured entirely through
OPENCODE_CONFIG_CONTENT: one `@ai-sdk/openai-compatible` provider whose baseURL is the capture proxy
and apiKey the session key. Start-up is made offline-safe: no models.dev fetch, no auto-update, no
plugin install from npm (OPENCODE_PURE), and no project config, so a task's own opencode.json cannot
redirect the agent. Training runs disable tools that leave the sandbox (webfetch, websearch,
codesearch). Its model entry carries `limit: {context, output}` sized to the engine's context
(`model_limit`): without it opencode asks for 32,000 completion tokens on every call, which an engine
with a 32k context refuses, so no call would be captured. opencode has no hard step limit of its own (`steps` only asks the model to stop), so the
proxy's `max_model_calls` is what ends a run at the step limit: it answers with a final message and
no tool call. Tool counts come from the JSON event stream it prints.

Task extras, as Harbor hands them over (`harbor/agents/installed/opencode.py`): the task's skills_dir is
copied into its global config folder's `skills/` (Harbor's `~/.config/opencode/skills/`; ours is under
XDG_CONFIG_HOME), and its MCP servers become `mcp` entries of the config above.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from harnesses._common import LOG_DIR, completion_budget
from harnesses.agent_process import AgentFiles, run_agent
from harnesses.assets import ensure_asset, extract_member, linux_machine, npm_pack
from harnesses.base import AgentOutcome, AgentRun
from harnesses.mcp import McpServers, mcp_servers
from harnesses.tool_metrics import ToolResult, summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from pathlib import Path

    from sandboxes.base import Sandbox

VERSION = "1.18.33"
PROVIDER = "harbor"
INSTALL_DIR = "/opt/harbor-rl/opencode"
BINARY = f"{INSTALL_DIR}/opencode"
EVENTS_LOG = f"{LOG_DIR}/opencode.jsonl"
STDERR_LOG = f"{LOG_DIR}/opencode.stderr.txt"
STATE_DIR = "/tmp/harbor-rl-opencode"
"""opencode's XDG config/data/cache/state folders (its session database and logs live here)."""
CONFIG_DIR = f"{STATE_DIR}/config/opencode"
"""Its global config folder (`$XDG_CONFIG_HOME/opencode`), the one it reads skills from."""
SKILLS_DIR = f"{CONFIG_DIR}/skills"
FILES = AgentFiles(EVENTS_LOG, STDERR_LOG, f"{STATE_DIR}/instruction.md", STATE_DIR)
OFF_SANDBOX_TOOLS = ("webfetch", "websearch", "codesearch")
OUTPUT_TOKEN_MAX = 32_000
"""opencode's completion size when its model has no `limit.output` (`OUTPUT_TOKEN_MAX` in its source)."""
OUTPUT_SHARE = 4
"""opencode asks for `limit.output` tokens on every call and compacts the conversation once it nears
`context - output`; a quarter of the context for the answer leaves three quarters for the prompt."""


class OpenCodeHarness:
    name = "opencode"

    def __init__(self, *, version: str = VERSION) -> None:
        self.version = version

    def image_layer(self) -> ImageLayer:
        """The pinned executable from the host cache (fetched with `npm pack` on first use)."""
        package = platform_package()
        assets = ensure_asset(f"{package}-{self.version}", lambda folder: self._fetch(package, folder))
        return ImageLayer(
            name=f"opencode-{self.version}",
            dockerfile_lines=[
                f"COPY opencode {BINARY}",
                f"RUN chmod 0755 {BINARY} && {BINARY} --version",
            ],
            context_dir=assets,
        )

    def _fetch(self, package: str, folder: Path) -> None:
        tarball = npm_pack(f"{package}@{self.version}", folder)
        extract_member(tarball, "package/bin/opencode", folder / "opencode")
        tarball.unlink()

    def command(self, run: AgentRun) -> list[str]:
        """The agent's argv; the instruction goes in on stdin (see `run`)."""
        # `--auto` approves permission prompts, which nobody is there to answer.
        return [BINARY, "run", "--format", "json", "--auto", "-m", f"{PROVIDER}/{run.model}"]

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG_CONTENT": json.dumps(render_config(run)),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_PURE": "1",  # no plugin packages fetched from npm at start-up
            "XDG_CONFIG_HOME": f"{STATE_DIR}/config",
            "XDG_DATA_HOME": f"{STATE_DIR}/data",
            "XDG_CACHE_HOME": f"{STATE_DIR}/cache",
            "XDG_STATE_HOME": f"{STATE_DIR}/state",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        # The instruction goes in on stdin, verbatim: as an argument opencode would wrap it in quotes
        # (it quotes arguments that contain spaces) and read a leading dash as a flag.
        env = self.environment(run)  # first: a task's MCP servers it cannot use are refused here
        process = await run_agent(
            sandbox, run, self.name, self.command(run), env, FILES, skills_folder=SKILLS_DIR
        )
        if process.events is None:
            return process.without_log()
        summary = parse_events(process.events)
        return process.outcome(
            summarize(summary.tool_results), summary.error, f"{summary.text}\n[steps: {summary.steps}]"
        )


def platform_package() -> str:
    """The npm package holding opencode's executable for this host (opencode-ai's postinstall logic)."""
    if linux_machine() == "aarch64":
        return "opencode-linux-arm64"
    # The default build needs AVX2; older x86-64 CPUs get the baseline build.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            has_avx2 = " avx2" in handle.read()
    except OSError:
        has_avx2 = False
    return "opencode-linux-x64" if has_avx2 else "opencode-linux-x64-baseline"


def render_config(run: AgentRun) -> dict[str, Any]:
    """opencode's config: one OpenAI-compatible provider at the proxy, nothing else reachable."""
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Harbor capture proxy",
                "options": {"baseURL": run.base_url, "apiKey": run.api_key},
                "models": {run.model: model_entry(run)},
            }
        },
        "model": f"{PROVIDER}/{run.model}",
        "small_model": f"{PROVIDER}/{run.model}",
        "autoupdate": False,
        "share": "disabled",
    }
    if run.purpose == "train":
        config["tools"] = dict.fromkeys(OFF_SANDBOX_TOOLS, False)
    if run.step_limit > 0:
        config["agent"] = {"build": {"steps": run.step_limit}}
    servers = mcp_servers(run, "opencode", headers=False)
    if servers.servers:
        config["mcp"] = mcp_config(servers)
    return config


def mcp_config(servers: McpServers) -> dict[str, Any]:
    """opencode's `mcp` entries, as Harbor writes them (`harbor/agents/installed/opencode.py:836-893`): a
    stdio server is `local` with its command line, an HTTP one `remote` with OAuth discovery off (a task's
    server has no OAuth to offer). opencode sends no headers, so a server with headers is refused."""
    entries: dict[str, Any] = {}
    for server in servers.servers:
        if server.transport == "stdio":
            entries[server.name] = {"type": "local", "command": [server.command, *server.args]}
        else:
            entries[server.name] = {"type": "remote", "url": server.url, "oauth": False}
    return entries


def model_entry(run: AgentRun) -> dict[str, Any]:
    """The provider's model entry; with a `limit` whenever the engine's context or a cap is known."""
    entry: dict[str, Any] = {"name": run.model}
    limit = model_limit(run.context_length, run.max_tokens)
    if limit is not None:
        entry["limit"] = limit
    return entry


def model_limit(context_length: int | None, max_tokens: int | None) -> dict[str, int] | None:
    """opencode's `limit` (both keys required by its schema; context 0 means unknown, no compaction):
    the completion size is a share of the context, the session's cap when lower, never above 32,000."""
    output = completion_budget(context_length, max_tokens, OUTPUT_TOKEN_MAX, share=OUTPUT_SHARE)
    return None if output is None else {"context": context_length or 0, "output": output}


class EventSummary(BaseModel):
    steps: int = 0
    text: str = ""
    """The agent's final text parts, for the log tail."""
    tool_results: list[ToolResult] = Field(default_factory=list)
    error: str | None = None


def parse_events(raw: str) -> EventSummary:
    """Tool calls, failures and errors from `opencode run --format json` output (one JSON event a line)."""
    summary = EventSummary()
    texts: list[str] = []
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # opencode prints the odd non-JSON line (warnings)
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        part = event.get("part") or {}
        if kind == "tool_use":
            summary.tool_results.append(_tool_result(part))
        elif kind == "step_finish":
            summary.steps += 1
        elif kind == "text" and part.get("text"):
            texts.append(str(part["text"]))
        elif kind == "error":
            summary.error = f"opencode reported an error: {_error_text(event.get('error'))}"
    summary.text = "\n".join(texts)
    return summary


def _tool_result(part: dict[str, Any]) -> ToolResult:
    state = part.get("state") or {}
    metadata = state.get("metadata") or {}
    status = state.get("status")
    exit_code = metadata.get("exit")
    failed = status == "error" or (isinstance(exit_code, int) and exit_code != 0)
    output = state.get("output") if status != "error" else state.get("error")
    return ToolResult(
        name=str(part.get("tool") or "unknown"), output=str(output or ""), error_reported=failed
    )


def _error_text(error: Any) -> str:
    """`APIError: bad key (HTTP 401)` from opencode's error object."""
    if not isinstance(error, dict):
        return str(error)[:1000]
    data = error.get("data") if isinstance(error.get("data"), dict) else {}
    message = str(data.get("message") or error.get("message") or "")
    status = f" (HTTP {data['statusCode']})" if data.get("statusCode") else ""
    return f"{error.get('name') or 'error'}: {message}{status}"[:1000]
