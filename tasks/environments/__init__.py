"""Built-in white-box environments (TRL's `environment_factory` contract): echo and a Wordle-like game,
learnable by a tiny model, a coding environment that works on any Harbor task in its sandbox, and
OpenSpiel's games (`tasks.environments.openspiel`, the `openspiel` extra: `--dataset openspiel:GAME`).

`Environment` is a base class that gives such a class OpenEnv's reward hooks (`_apply_rubric`,
`_reset_rubric`, `_apply_transform`).

The named dataset `env-tasks` (`harbor serve --dataset env-tasks`, see `tasks.datasets`) holds tasks
that run the echo and word-game environments through the `env-factory` harness.
"""

from tasks.environments.base import Environment
from tasks.environments.coding import CodingEnv, coding_reward
from tasks.environments.echo import EchoEnv, echo_reward, echo_shaped_reward
from tasks.environments.openspiel import OpenSpielEnv
from tasks.environments.wordle import WordleEnv, wordle_invalid, wordle_partial, wordle_win

__all__ = [
    "CodingEnv",
    "EchoEnv",
    "Environment",
    "OpenSpielEnv",
    "WordleEnv",
    "coding_reward",
    "echo_reward",
    "echo_shaped_reward",
    "wordle_invalid",
    "wordle_partial",
    "wordle_win",
]
