"""Errors raised by the harness layer, each with a message a user can act on."""

from __future__ import annotations


class HarnessError(Exception):
    """Base class for harness failures (not the agent's own task failures, which are outcomes)."""


class UnknownHarness(HarnessError, KeyError):
    """A harness name that is not registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown harness {name!r}; available harnesses: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class HarnessConfigError(HarnessError):
    """A harness was asked for something it cannot do (e.g. oracle without a solution folder)."""


class HarnessAssetError(HarnessError):
    """Fetching a harness's pinned packages on the host (pip download, npm pack) failed."""
