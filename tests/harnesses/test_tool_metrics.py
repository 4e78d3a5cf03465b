"""docs/design.md 3.8's failure counting rules."""

from __future__ import annotations

from harnesses.tool_metrics import ToolResult, is_failure, summarize


def test_a_reported_error_is_a_failure_whatever_the_text() -> None:
    assert is_failure(ToolResult(name="bash", output="", error_reported=True))


def test_failure_words_count_case_insensitively() -> None:
    for text in (
        "ERROR: no such file",
        "build Failed",
        "Traceback (most recent call last)",
        "RuntimeException",
    ):
        assert is_failure(ToolResult(name="bash", output=text)), text
    assert not is_failure(ToolResult(name="bash", output="all 3 tests passed"))


def test_calls_are_counted_by_name() -> None:
    results = [ToolResult(name="bash"), ToolResult(name="read"), ToolResult(name="bash")]
    assert summarize(results).calls_by_name == {"bash": 2, "read": 1}
    assert summarize(results).total_calls == 3


def test_the_same_failure_repeated_counts_once() -> None:
    same = [ToolResult(name="bash", output="error: x" + " " * 300 + str(i)) for i in range(3)]
    other_tool = ToolResult(name="read", output="error: x" + " " * 300)
    other_text = ToolResult(name="bash", output="failed: y")
    metrics = summarize([*same, other_tool, other_text])
    assert metrics.calls_by_name == {"bash": 4, "read": 1}
    # the three `same` differ only after 200 characters: one failure; the other two are distinct
    assert metrics.failures == 3 and metrics.failures_by_name == {"bash": 2, "read": 1}


def test_no_calls_no_failures() -> None:
    metrics = summarize([])
    assert metrics.calls_by_name == {} and metrics.failures == 0
