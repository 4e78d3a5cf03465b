"""What validation reports: a Finding (severity, stable code, message, location) per broken or
noteworthy rule. Both the trace checks (`validation`) and the rollout graph (`graph`) produce them."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Severity(StrEnum):
    FATAL = "FATAL"
    """The trace cannot be trained on."""
    WARN = "WARN"
    """Kept and trainable, but worth a look."""
    INFO = "INFO"


class Finding(BaseModel):
    """One broken (or noteworthy) rule, and where."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    severity: Severity
    code: str
    """Stable identifier of the rule, e.g. `length_mismatch`."""
    message: str
    location: str = ""
    """Where in the trace, e.g. `turns[3].loss_mask[7]`; empty for the trace as a whole."""


def fatal(findings: Iterable[Finding]) -> list[Finding]:
    """The FATAL findings among `findings`."""
    return [f for f in findings if f.severity == Severity.FATAL]
