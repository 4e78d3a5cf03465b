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


OPENENV_REQUIREMENT = "openenv==0.10.0"
"""The OpenEnv release the OpenEnv adapters are written and tested against (pyproject's `openenv` extra)."""


class OpenEnvMissingError(HarnessConfigError, ImportError):
    """The OpenEnv adapters were asked for, and the `openenv` package cannot be imported."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(
            f"{what} needs OpenEnv ({OPENENV_REQUIREMENT}), which cannot be imported ({cause}); "
            "install it with: pip install 'harbor-rl[openenv]'"
        )
