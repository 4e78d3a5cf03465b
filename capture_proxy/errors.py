"""Errors of the capture layer, in one hierarchy."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capture_proxy.validation import Finding


class CaptureError(Exception):
    """Base class for capture-layer failures."""


class InvalidTraceError(CaptureError):
    """A trace with FATAL findings was asked for in its training form."""

    def __init__(self, findings: list[Finding], session_id: str | None = None):
        self.findings = findings
        self.session_id = session_id
        fatal = [f for f in findings if f.severity == "FATAL"]
        where = f"trace {session_id}" if session_id else "trace"
        lines = "; ".join(f"{f.code} at {f.location}: {f.message}" for f in fatal[:5])
        more = f" (+{len(fatal) - 5} more)" if len(fatal) > 5 else ""
        super().__init__(f"{where} cannot be trained on: {len(fatal)} FATAL finding(s): {lines}{more}")


class StoreError(CaptureError):
    """The trace store could not read or write."""


class SessionNotFound(StoreError):
    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(f"no capture session with id {session_id!r}")
