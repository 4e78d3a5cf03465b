"""Run in Harbor's own venv (tests/harbor_ref): what Harbor's installed agents hand their agent for a task's
MCP servers, printed as one JSON object, for test_task_extras.py to compare with ours.

    python harbor_agent_configs.py '{"servers": [...], "instruction": "..."}'

Headers go to claude-code and codex only (the agents Harbor sends them for); the others get the servers
without their headers.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from unittest.mock import MagicMock

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-table fetch at import
os.environ.setdefault("OPENAI_API_KEY", "unused")  # mini-swe-agent checks that a key is set

from harbor.agents.installed.claude_code import ClaudeCode  # noqa: E402
from harbor.agents.installed.codex import Codex  # noqa: E402
from harbor.agents.installed.mini_swe_agent import MiniSweAgent  # noqa: E402
from harbor.agents.installed.opencode import OpenCode  # noqa: E402
from harbor.agents.installed.qwen_code import QwenCode  # noqa: E402
from harbor.models.agent.context import AgentContext  # noqa: E402
from harbor.models.task.config import MCPServerConfig  # noqa: E402


def mini_task(agent: MiniSweAgent, instruction: str) -> str:
    """The `--task` text of the command Harbor's mini-swe-agent runs (its environment is a fake)."""
    commands: list[str] = []

    async def record(*args, **kwargs):
        commands.append(kwargs.get("command") or args[1])
        return MagicMock(return_code=0, stdout="", stderr="")

    agent._exec = record
    asyncio.run(agent.run(instruction, MagicMock(), AgentContext()))
    words = shlex.split(next(c for c in commands if "--task=" in c))
    return next(w for w in words if w.startswith("--task=")).removeprefix("--task=")


def main() -> None:
    spec = json.loads(sys.argv[1])
    servers = [MCPServerConfig.model_validate(s) for s in spec["servers"]]
    plain = [s.model_copy(update={"headers": {}}) for s in servers]
    logs = Path(tempfile.mkdtemp())

    def make(cls, model, chosen):
        return cls(logs_dir=logs, model_name=model, mcp_servers=chosen)

    claude = make(ClaudeCode, "anthropic/m", servers)._build_register_mcp_servers_command()
    opencode = make(OpenCode, "openai/m", plain)._build_register_config_command()
    print(
        json.dumps(
            {
                "claude-code": json.loads(shlex.split(claude)[1]),
                "codex": make(Codex, "openai/m", servers)._build_effective_config()["mcp_servers"],
                "qwen-code": make(QwenCode, "openai/m", plain)._build_effective_settings()["mcpServers"],
                "opencode": json.loads(shlex.split(opencode.split("&&", 1)[1])[1])["mcp"],
                "mini-swe-agent": mini_task(make(MiniSweAgent, "openai/m", plain), spec["instruction"]),
            }
        )
    )


if __name__ == "__main__":
    main()
