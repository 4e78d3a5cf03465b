"""Small helpers shared by the harness modules."""

from __future__ import annotations

LOG_DIR = "/logs/agent"
"""Where agents write their logs inside the sandbox (docs/design.md 3.5)."""

LOG_TAIL_CHARS = 4000


def tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last `limit` characters of `text`, for AgentOutcome.log_tail."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


def timeout_grace(timeout_s: float) -> float:
    """Sandbox exec limit for a command that enforces `timeout_s` itself with coreutils `timeout`.

    The command's own `timeout` kills the agent first (so we still collect its logs); the exec limit
    is the backstop a few seconds later.
    """
    return timeout_s + 30.0


def timeout_prefix(timeout_s: float) -> str:
    """`timeout` wrapper: TERM at the limit, KILL 10 s later; exit code 124 means it fired."""
    return f"timeout --kill-after=10 {max(1, int(timeout_s))}"


def completion_budget(
    context_length: int | None, max_tokens: int | None, default: int, *, share: int = 4
) -> int | None:
    """The completion size an agent that asks for a fixed one every call should ask for: `1/share` of
    the engine's context (the rest holds the prompt), the session's cap when lower, never above the
    agent's own `default`; None when neither the context nor a cap is known (the agent's default)."""
    if context_length is None and max_tokens is None:
        return None
    budget = default
    if context_length:
        budget = min(budget, max(1, context_length // share))
    if max_tokens:
        budget = min(budget, max_tokens)
    return budget
