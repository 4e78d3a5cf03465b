"""Tool-call metrics per rollout (docs/design.md 3.8): calls by tool name, and failures.

A tool call failed when the harness reported an error for it (a non-zero exit, a timeout, a rejected
call), or, because loop-owning agents do not always report errors in a structured way, when its result
text mentions error, failed, traceback or exception (case-insensitive). One failure repeated verbatim
(same tool, same first 200 characters of output) counts once, so an agent stuck in a loop does not
inflate the count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from pydantic import BaseModel, Field

FAILURE_WORDS = re.compile(r"error|failed|traceback|exception", re.IGNORECASE)
DEDUP_PREFIX_CHARS = 200


class ToolResult(BaseModel):
    """One tool call as a harness saw it."""

    name: str
    output: str = ""
    """The tool's result text as the model saw it."""
    error_reported: bool = False
    """The harness itself said the call failed (exit code, timeout, invalid call)."""


class ToolMetrics(BaseModel):
    calls_by_name: dict[str, int] = Field(default_factory=dict)
    failures_by_name: dict[str, int] = Field(default_factory=dict)
    """Distinct failures of each tool (TRL reports them as `tools/<name>/failure_total`)."""

    @property
    def total_calls(self) -> int:
        return sum(self.calls_by_name.values())

    @property
    def failures(self) -> int:
        return sum(self.failures_by_name.values())


def is_failure(result: ToolResult) -> bool:
    return result.error_reported or bool(FAILURE_WORDS.search(result.output))


def summarize(results: Iterable[ToolResult]) -> ToolMetrics:
    """Count calls and distinct failures by tool name."""
    calls: Counter[str] = Counter()
    failed: set[tuple[str, str]] = set()
    for result in results:
        calls[result.name] += 1
        if is_failure(result):
            failed.add((result.name, result.output[:DEDUP_PREFIX_CHARS]))
    return ToolMetrics(calls_by_name=dict(calls), failures_by_name=dict(Counter(name for name, _ in failed)))
