"""Errors of the white-box (`environment_factory`) path, each naming the class, tool or function at fault."""

from __future__ import annotations

from harnesses.errors import HarnessConfigError, HarnessError


class EnvironmentContractError(HarnessConfigError, TypeError):
    """An environment class breaks TRL's `environment_factory` contract (found at load time)."""


class EnvironmentLoadError(HarnessConfigError, ImportError):
    """`module:Class` does not name an importable class."""


class RewardFunctionError(HarnessError, ValueError):
    """A reward function returned something other than one float-or-None per sample."""


class EpisodeError(HarnessError):
    """An episode could not run to an end (the model endpoint failed, reset raised)."""
