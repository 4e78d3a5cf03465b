"""`codex`: OpenAI's Codex CLI (npm `@openai/codex`, pinned), run unchanged as `codex exec` against the
capture proxy's Responses API.

Install: `@openai/codex` is a launcher whose per-platform package (`@openai/codex@<version>-linux-x64`)
holds a static (musl) executable and the ripgrep it searches with. The host fetches that package with
`npm pack` (`harnesses.assets`) and the image layer copies both to /opt/harbor-rl/codex.

Run: `codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --ephemeral -`
with the instruction on stdin (the Docker sandbox is the sandbox: codex's own would need namespaces a
container does not grant). Configured entirely through `$CODEX_HOME/config.toml`: one model provider,
`harbor`, whose `base_url` is the proxy, `wire_api = "responses"`, and whose key is read from an
environment variable holding the session key. Nothing else is reached: no update check, analytics and
feedback off, no hosted web search (the engine cannot run it, and the proxy refuses hosted tools), and
no execpolicy rules (`--ignore-rules`). The engine's context, when known, is its
`model_context_window`, so it compacts in time. Codex has no step limit of its own: the proxy's
`max_model_calls` ends a run at the step limit with a final message. Tool counts come from the session
rollout it writes under `$CODEX_HOME/sessions/` (every `function_call` and its output; the `--json`
events list only commands and file changes), errors from the `--json` events it prints.

Task extras, as Harbor hands them over (`harbor/agents/installed/codex.py`): the task's skills_dir is
copied into a user skills folder codex reads (see SKILLS_DIR), and its MCP servers become
`[mcp_servers.<name>]` tables of the config.toml above, header values named by environment variable
(`env_http_headers`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pydantic import BaseModel

from harnesses._common import LOG_DIR
from harnesses.agent_process import AgentFiles, run_agent
from harnesses.assets import ensure_asset, linux_machine, npm_files
from harnesses.base import AgentOutcome, AgentRun
from harnesses.mcp import McpServers, mcp_servers
from harnesses.tool_metrics import ToolResult, summarize
from sandboxes.base import ImageLayer

if TYPE_CHECKING:
    from sandboxes.base import Sandbox

VERSION = "0.171.0"
PROVIDER = "harbor"
INSTALL_DIR = "/opt/harbor-rl/codex"
BINARY = f"{INSTALL_DIR}/codex"
EVENTS_LOG = f"{LOG_DIR}/codex.jsonl"
STDERR_LOG = f"{LOG_DIR}/codex.stderr.txt"
CODEX_HOME = "/opt/harbor-rl/codex-home"
"""Its config, logs and state; not under /tmp, where codex refuses to put its helper binaries."""
FILES = AgentFiles(EVENTS_LOG, STDERR_LOG, f"{CODEX_HOME}/instruction.md", CODEX_HOME)
KEY_ENV = "HARBOR_SESSION_KEY"
ROLLOUTS = f"{CODEX_HOME}/sessions"
SKILLS_DIR = f"{CODEX_HOME}/skills"
"""Its user skills folder under our CODEX_HOME (Harbor copies to `$HOME/.agents/skills/`, which codex
also reads; ours keeps the task's HOME untouched and the skills with the run's own state)."""


class CodexHarness:
    name = "codex"

    def __init__(self, *, version: str = VERSION) -> None:
        self.version = version

    def image_layer(self) -> ImageLayer:
        """The pinned executable and its ripgrep from the host cache (fetched with `npm pack` on first use)."""
        arch = "arm64" if linux_machine() == "aarch64" else "x64"
        triple = f"{linux_machine()}-unknown-linux-musl"
        members = {
            f"package/vendor/{triple}/bin/codex": "codex",
            f"package/vendor/{triple}/codex-path/rg": "rg",
        }
        spec = f"@openai/codex@{self.version}-linux-{arch}"
        assets = ensure_asset(
            f"codex-linux-{arch}-{self.version}", lambda folder: npm_files(spec, folder, members)
        )
        return ImageLayer(
            name=f"codex-{self.version}",
            dockerfile_lines=[
                f"COPY codex rg {INSTALL_DIR}/",
                f"RUN chmod 0755 {BINARY} {INSTALL_DIR}/rg && {BINARY} --version",
            ],
            context_dir=assets,
        )

    def command(self, run: AgentRun) -> list[str]:
        """The agent's argv; `-` reads the instruction from stdin."""
        return [
            BINARY, "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--ignore-rules", "--color", "never", "-m", run.model, "-",
        ]  # fmt: skip

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "CODEX_HOME": CODEX_HOME,
            KEY_ENV: run.api_key,
            "PATH": f"{INSTALL_DIR}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }

    async def run(self, sandbox: Sandbox, run: AgentRun) -> AgentOutcome:
        servers = mcp_servers(run, self.name, headers=True)
        config = {f"{CODEX_HOME}/config.toml": render_config(run, servers).encode()}
        env = {**self.environment(run), **servers.env}
        process = await run_agent(
            sandbox, run, self.name, self.command(run), env, FILES, config, skills_folder=SKILLS_DIR
        )
        if process.events is None:
            return process.without_log()
        summary = parse_events(process.events)
        return process.outcome(
            summarize(parse_rollout(await _rollout(sandbox))),
            summary.error,
            f"{summary.text}\n[turns: {summary.turns}]",
            stopped_at_limit=summary.truncated,
        )


def render_config(run: AgentRun, servers: McpServers | None = None) -> str:
    """codex's config.toml: the proxy as its only provider, everything else that reaches out off, and the
    task's MCP servers."""
    lines = [
        f"model = {_toml(run.model)}",
        f"model_provider = {_toml(PROVIDER)}",
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
    ]
    if run.context_length:
        lines.append(f"model_context_window = {run.context_length}")
    lines += [
        "",
        f"[model_providers.{PROVIDER}]",
        'name = "Harbor capture proxy"',
        f"base_url = {_toml(run.base_url)}",
        f"env_key = {_toml(KEY_ENV)}",
        'wire_api = "responses"',
        "request_max_retries = 0",  # a refused call is the rollout's outcome, not something to hammer
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
    ]
    return "\n".join(lines + (mcp_tables(servers) if servers else []))


def mcp_tables(servers: McpServers) -> list[str]:
    """`[mcp_servers.<name>]` tables, as Harbor writes them (`harbor/agents/installed/codex.py:1987-2047`):
    `command` and `args` for stdio, `url` for HTTP (codex speaks streamable HTTP; Harbor does not tell SSE
    apart either), and `env_http_headers` naming the variable that holds each header's value."""
    lines: list[str] = []
    for server in servers.servers:
        lines.append(f"[mcp_servers.{_toml(server.name)}]")
        if server.transport == "stdio":
            lines += [f"command = {_toml(server.command or '')}", f"args = {json.dumps(server.args)}"]
        else:
            lines.append(f"url = {_toml(server.url or '')}")
        refs = servers.header_refs.get(server.name)
        if refs:
            pairs = ", ".join(f"{_toml(name)} = {_toml(var)}" for name, var in refs.items())
            lines.append(f"env_http_headers = {{ {pairs} }}")
        lines.append("")
    return lines


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escaping is a subset TOML reads)."""
    return json.dumps(value)


class EventSummary(BaseModel):
    turns: int = 0
    text: str = ""
    """The agent's last message, for the log tail."""
    error: str | None = None
    truncated: bool = False
    """Its turn ended because the model's reply reached the token limit (`response.incomplete`): the
    agent's own outcome, like a wrong answer, not a harness failure (codex then exits 1)."""


async def _rollout(sandbox: Sandbox) -> str:
    """The session rollout codex wrote (one per run: its CODEX_HOME is the run's own); "" if none."""
    found = await sandbox.exec(["sh", "-c", f"ls {ROLLOUTS}/*/*/*/rollout-*.jsonl 2>/dev/null | head -1"])
    path = found.stdout.strip()
    if not path:
        return ""
    return (await sandbox.download_file(path)).decode("utf-8", errors="replace")


def parse_rollout(raw: str) -> list[ToolResult]:
    """Each tool call of a codex session rollout (`response_item` lines: a `function_call` and later its
    `function_call_output`, joined by `call_id`), named as the model called it."""
    names: dict[str, str] = {}
    results: list[ToolResult] = []
    for line in raw.splitlines():
        try:
            payload = json.loads(line).get("payload")
        except (ValueError, AttributeError):
            continue
        if not isinstance(payload, dict):
            continue
        if payload.get("type") in ("function_call", "custom_tool_call", "local_shell_call"):
            names[str(payload.get("call_id"))] = str(payload.get("name") or payload["type"])
        elif payload.get("type") in ("function_call_output", "custom_tool_call_output"):
            output = payload.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            results.append(ToolResult(name=names.get(str(payload.get("call_id")), "unknown"), output=text))
    return results


def parse_events(raw: str) -> EventSummary:
    """The final message and errors from `codex exec --json` (one JSON event a line)."""
    summary = EventSummary()
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        if kind == "item.completed" and item.get("type") == "agent_message":
            summary.text = str(item.get("text") or "")
        elif kind == "turn.completed":
            summary.turns += 1
        elif kind == "turn.failed":
            message = (
                (event.get("error") or {}).get("message") if isinstance(event.get("error"), dict) else None
            )
            text = str(message or event)[:1000]
            if "Incomplete response returned" in text:
                summary.truncated = True
                summary.text = text
            else:
                summary.error = f"codex reported an error: {text}"
    return summary
