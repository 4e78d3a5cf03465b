"""Errors of the capture layer, in one hierarchy."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capture_proxy.findings import Finding


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


class ProxyRequestError(CaptureError):
    """A request the proxy answers with an OpenAI-style error (bad input, bad key, engine failure)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        super().__init__(message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def upstream_error(status: int, message: str, code: str) -> ProxyRequestError:
    """The 502/504 an agent gets when the engine could not be reached or failed."""
    return ProxyRequestError(status, message, type="upstream_error", code=code)


class TurnExists(StoreError):
    """A turn with the same (session_id, seq) is already stored."""


class InvalidSessionUpdate(StoreError):
    """A session update names an unknown field, a bad value, or leaves a final status."""
