"""The stream-json event log that Claude Code (`claude -p --output-format stream-json --verbose`) prints,
and Qwen Code prints in the same shape: what the agent did, for tool metrics and errors."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from harnesses.tool_metrics import ToolResult


class EventSummary(BaseModel):
    turns: int = 0
    text: str = ""
    """The final result text, for the log tail."""
    tool_results: list[ToolResult] = Field(default_factory=list)
    error: str | None = None
    at_turn_limit: bool = False
    """It stopped at `--max-turns` (and exits 1 for it): the step limit, not a failure."""


def parse_events(raw: str, agent: str) -> EventSummary:
    """Tool calls, failures and errors from `agent`'s stream-json output (one JSON event a line:
    `assistant` messages with `tool_use` blocks, `user` messages with their `tool_result`s, one
    closing `result`)."""
    summary = EventSummary()
    names: dict[str, str] = {}
    for line in raw.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        content = (event.get("message") or {}).get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        if kind == "assistant":
            for block in blocks:
                if block.get("type") == "tool_use":
                    names[str(block.get("id"))] = str(block.get("name") or "unknown")
        elif kind == "user":
            for block in blocks:
                if block.get("type") == "tool_result":
                    summary.tool_results.append(
                        ToolResult(
                            name=names.get(str(block.get("tool_use_id")), "unknown"),
                            output=_text(block.get("content")),
                            error_reported=bool(block.get("is_error")),
                        )
                    )
        elif kind == "result":
            summary.turns = int(event.get("num_turns") or 0)
            summary.text = str(event.get("result") or "")
            summary.at_turn_limit = event.get("subtype") == "error_max_turns"
            if event.get("is_error") and not summary.at_turn_limit:
                summary.error = (
                    f"claude-code reported an error: {summary.text[:1000] or event.get('subtype')}"
                )
    return summary


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""
