"""Errors of `harbor jobs`: one hierarchy, each message says what to change."""

from __future__ import annotations


class JobsError(Exception):
    """Base class of every `harbor jobs` error."""


class JobConfigError(JobsError, ValueError):
    """The launch configuration is invalid (unknown flavour, bad timeout, a secret passed as plain env...)."""


class MissingSecretError(JobsError):
    """A secret the job needs is not set in the local environment."""


class HubError(JobsError):
    """The Hugging Face Hub refused or failed a jobs call."""


class LauncherError(JobsError):
    """The on-job launcher could not bring its processes up."""


class ProcessFailedError(LauncherError):
    """One of the launcher's processes exited or never became healthy; carries its name and log tail."""

    def __init__(self, name: str, reason: str, log_tail: str) -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        tail = log_tail.rstrip() or "(no output)"
        super().__init__(f"{name} {reason}; last lines of its log:\n{tail}")
