"""A task's MCP servers (`[[environment.mcp_servers]]`), read from `AgentRun.mcp_servers` for the harnesses
that hand them to their agent, each in the agent's own config format (as Harbor's installed agents do).

The servers are the task's own: a process the agent starts inside the sandbox (stdio), or one it reaches
over the task's network (a compose sidecar, a service in the image). Either is inside the sandbox
boundary, governed by the sandbox's network policy like every other connection the agent makes, so
train runs hand them over too: the "no tools that leave the sandbox" rule (webfetch, websearch off) is
about the agent's built-in tools that reach the internet, which the network policy does not see.

Header values are `${VAR}` templates read from this host's environment at run time
(`harbor/agents/mcp_headers.py`). As in Harbor, the resolved values never go into a config file: they
travel in the agent's exec environment under private names (`HARBOR_MCP_AUTH_<server>_<header>`) that
the config refers to. They are never logged.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pydantic import ValidationError

from harnesses.base import AgentRun
from harnesses.errors import HarnessConfigError
from tasks.models import MCPServerConfig

_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
"""Harbor's `${VAR}` / `${VAR:-default}`, anywhere in a header value (`harbor/utils/env.py`)."""


@dataclass(frozen=True)
class McpServers:
    """The run's servers, and their header values as environment variables for the agent's exec."""

    servers: list[MCPServerConfig]
    header_refs: dict[str, dict[str, str]]
    """Server name -> header name -> the environment variable holding its value."""
    env: dict[str, str]
    """Those variables and their resolved values (secrets: pass them only in the exec environment)."""


def mcp_servers(run: AgentRun, agent: str, *, headers: bool) -> McpServers:
    """The run's MCP servers; a HarnessConfigError when one is malformed, or has headers and `agent` cannot
    send them (`headers=False`: Harbor refuses the trial for agents without `mcp_http_headers`,
    `harbor/trial/trial.py:1816-1825`)."""
    servers = [_server(entry) for entry in run.mcp_servers]
    refs: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {}
    for i, server in enumerate(servers):
        if not server.headers:
            continue
        if not headers:
            raise HarnessConfigError(
                f"{agent} cannot send HTTP headers to MCP server {server.name!r} (Harbor refuses this too); "
                "use claude-code or codex, or a server without headers"
            )
        for j, (name, template) in enumerate(server.headers.items()):
            variable = f"HARBOR_MCP_AUTH_{i}_{j}"
            refs.setdefault(server.name, {})[name] = variable
            env[variable] = resolve_header(template, f"MCP server {server.name!r} header {name!r}")
    return McpServers(servers, refs, env)


def _server(entry: dict) -> MCPServerConfig:
    try:
        return MCPServerConfig.model_validate(entry)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise HarnessConfigError(f"MCP server {entry.get('name')!r}: {problem}") from None


def resolve_header(template: str, where: str) -> str:
    """`template` with each `${VAR}` (or `${VAR:-default}`) replaced from this host's environment; an unset
    variable without a default is a HarnessConfigError naming it (never the value)."""

    def value(match: re.Match[str]) -> str:
        name, default = match.groups()
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise HarnessConfigError(f"{where} = '${{{name}}}': {name} is not set on this host; export it first")

    resolved = _TEMPLATE.sub(value, template)
    if "\r" in resolved or "\n" in resolved:
        raise HarnessConfigError(f"{where}: its value must not contain newlines")
    return resolved
