"""The scripted teacher's play on coding tasks: each task's known solution as the harness's own tool calls.

A coding harness (mini-swe-agent, opencode) offers the model a `bash` tool. The teacher finds the task
by its instruction, which every harness quotes verbatim in its first user message, and answers:

1. call `bash` with the task's `solution/solve.sh` (without its `#!` line) as the command, once;
2. then end the way that harness ends: mini-swe-agent's instructions ask for
   `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` as a command of its own
   (`minisweagent/config/mini.yaml` in mini-swe-agent 2.4.6), so the teacher calls that; a harness that
   asks for no such command (opencode) ends when the model answers without a tool call, so it does.

The conversation the capture proxy records is therefore the harness's own: its system prompt, its tool
schema, its observation of the command. A solution that reads files of `solution/` (which only the
oracle sees) cannot be played as an agent's command, and is refused when the table is built.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from evaluation.errors import ProviderError
from tasks import Task

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's way to finish (its prompt: "Do not combine it with any other command")."""
BASH = "bash"


def solution_command(task: Task) -> str:
    """The task's solve.sh as one bash command; ProviderError when it cannot be played by an agent."""
    script = task.paths.solve_script
    if not script.is_file():
        raise ProviderError(f"task {task.id!r} has no solution/solve.sh: the scripted teacher cannot play it")
    text = script.read_text()
    if "/solution" in text:
        raise ProviderError(
            f"{script}: the solution reads files from /solution, which an agent never sees; the scripted "
            "teacher plays only self-contained solutions"
        )
    lines = text.splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    command = "\n".join(lines).strip()
    if not command:
        raise ProviderError(f"{script} is empty")
    return command


class CodingScripts:
    """instruction -> solution command of every coding task a run may meet."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self.commands = {task.instruction.strip(): solution_command(task) for task in tasks}

    def command_for(self, messages: list[dict[str, Any]]) -> str | None:
        """The solution of the task the conversation is about (the longest instruction quoted in it)."""
        said = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
        found = [instruction for instruction in self.commands if instruction in said]
        return self.commands[max(found, key=len)] if found else None

    def move(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Arguments of the next `bash` call, or None to answer without a tool call (the episode ends)."""
        messages = body.get("messages") or []
        command = self.command_for(messages)
        if command is None:
            return None
        ran = [_arguments(call).get("command") for call in _bash_calls(messages)]
        if command not in ran:
            return _fill_required(body, {"command": command}, "Apply the fix")
        asks_submit = any(SUBMIT in _text(m.get("content")) for m in messages if m.get("role") != "assistant")
        if asks_submit and SUBMIT not in ran:
            return _fill_required(body, {"command": SUBMIT}, "Submit")
        return None


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _bash_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        call
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if call.get("function", {}).get("name") == BASH
    ]


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(call["function"].get("arguments") or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _fill_required(body: dict[str, Any], arguments: dict[str, Any], description: str) -> dict[str, Any]:
    """Give every other required string parameter of the harness's `bash` schema a value, so the call
    passes the harness's own validation whatever its schema asks for beyond `command`."""
    for tool in body.get("tools") or []:
        function = tool.get("function") or {}
        if function.get("name") != BASH:
            continue
        schema = function.get("parameters") or {}
        properties = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in arguments and (properties.get(name) or {}).get("type") == "string":
                arguments[name] = description
    return arguments
