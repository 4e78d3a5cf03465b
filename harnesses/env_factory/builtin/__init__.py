"""Built-in white-box environments: echo and a Wordle-like game (learnable by a tiny model), and a
coding environment that works on any Harbor task in its sandbox.

`ENV_TASKS_DIR` is a task dataset (`harbor serve --dataset <it>`) whose tasks run the echo and word
game environments through the `env-factory` harness.
"""

from pathlib import Path

from harnesses.env_factory.builtin.coding import CodingEnv, coding_reward
from harnesses.env_factory.builtin.echo import EchoEnv, echo_reward, echo_shaped_reward
from harnesses.env_factory.builtin.wordle import WordleEnv, wordle_invalid, wordle_partial, wordle_win

ENV_TASKS_DIR = Path(__file__).parent / "env-tasks"

__all__ = [
    "ENV_TASKS_DIR",
    "CodingEnv",
    "EchoEnv",
    "WordleEnv",
    "coding_reward",
    "echo_reward",
    "echo_shaped_reward",
    "wordle_invalid",
    "wordle_partial",
    "wordle_win",
]
