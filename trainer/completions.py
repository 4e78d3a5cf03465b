"""`log_completions` (TRL's option): a logged step's rollouts as a rich table on the console, and every one
of them as a line of `completions.jsonl` in the output folder."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trainer.advantages import group_advantages
from trainer.rollout_worker import RolloutGroup

REPLY_CHARS = 300
"""How much of a reply the table shows (the file keeps it whole)."""


class CompletionLog:
    def __init__(self, output_dir: str | Path, limit: int | None, negative_scale: float) -> None:
        self.path = Path(output_dir) / "completions.jsonl"
        self.limit = limit
        self.negative_scale = negative_scale
        self.console = Console(stderr=True)

    def log(self, step: int, groups: Sequence[RolloutGroup]) -> list[dict[str, Any]]:
        records = [record for group in groups for record in self._records(step, group)]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
        self.console.print(self._table(step, records[: self.limit]))
        return records

    def _records(self, step: int, group: RolloutGroup) -> list[dict[str, Any]]:
        advantages = group_advantages([s.reward for s in group.samples], self.negative_scale).advantages
        return [
            {
                "step": step,
                "group": group.position,
                "task": _task_name(group.prompt),
                "member": sample.member,
                "reward": sample.reward,
                "advantage": advantage,
                "status": sample.outcome.status if sample.outcome is not None else "failed",
                "completion": reply_text(sample.outcome.completion) if sample.outcome is not None else "",
                "error": sample.error,
            }
            for sample, advantage in zip(group.samples, advantages, strict=True)
        ]

    @staticmethod
    def _table(step: int, records: Sequence[dict[str, Any]]) -> Table:
        table = Table(title=f"step {step}: completions", show_lines=True)
        for column in ("task", "member", "reward", "advantage", "completion"):
            table.add_column(column, overflow="fold")
        for r in records:
            reply = (
                r["completion"]
                if len(r["completion"]) <= REPLY_CHARS
                else r["completion"][:REPLY_CHARS] + "…"
            )
            table.add_row(
                r["task"],
                str(r["member"]),
                _number(r["reward"]),
                _number(r["advantage"]),
                reply or r["error"] or "",
            )
        return table


def reply_text(completion: Sequence[dict[str, Any]]) -> str:
    """The final assistant message: its text, then its tool calls as `name(arguments)`."""
    if not completion or completion[-1].get("role") != "assistant":
        return ""
    message = completion[-1]
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    calls = [
        f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments', '')})"
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return "\n".join(part for part in [str(content or ""), *calls] if part)


def _task_name(prompt: dict[str, Any]) -> str:
    """The row's task id, else its prompt's last message (TRL's rows are prompts)."""
    for key in ("task_id", "task", "name"):
        if prompt.get(key) is not None:
            return str(prompt[key])
    text = prompt.get("prompt")
    if isinstance(text, list) and text and isinstance(text[-1], dict):
        text = text[-1].get("content")
    return str(text or "")[:80]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
