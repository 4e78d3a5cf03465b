"""Which exceptions are a user's mistake (a one-line message) and which are bugs (a traceback).

Every package raises its own errors (`<package>/errors.py`), each with a message that names what is
wrong; those, and pydantic's ValidationError of a config built from flags, are what a user causes.
Anything else is a bug in harbor and keeps its traceback.
"""

from __future__ import annotations

import sys

USER_ERRORS: tuple[tuple[str, str], ...] = (
    ("engine.errors", "EngineError"),
    ("capture_proxy.errors", "CaptureError"),
    ("sandboxes.errors", "SandboxError"),
    ("tasks.errors", "TaskError"),
    ("harnesses.errors", "HarnessError"),
    ("inspector.errors", "InspectorError"),
    ("harbor_server.errors", "HarborServerError"),
    ("evaluation.errors", "EvaluationError"),
    ("trainer.errors", "TrainerError"),
    ("harbor_rl.jobs.errors", "JobsError"),
)
"""The base class of each package's errors, by module and name: looked up in `sys.modules` only, so
checking an exception imports nothing (an error of a module never imported cannot have been raised)."""


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message for an error the user caused; None for anything else (a bug)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return validation_message(exc)
    for module_name, class_name in USER_ERRORS:
        base = getattr(sys.modules.get(module_name), class_name, None)
        if base is not None and isinstance(exc, base):
            return str(exc) or type(exc).__name__
    return None


def validation_message(exc: BaseException) -> str:
    """A pydantic ValidationError as `field: problem; ...`, without pydantic's URLs and line breaks."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    parts = []
    for error in errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        problem = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {problem}" if where else problem)
    return "; ".join(parts) or str(exc)
