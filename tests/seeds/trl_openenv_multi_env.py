"""TRL's multi-environment blocks (guide/trl_openenv_multi_env.py), as they run here. Above the marker,
what the blocks use but the guide defines elsewhere: the imports, the two Space URLs, the two prompts and
`_format_catch_obs`, written here; in the block, the guide's elided docstrings and `...` bodies are filled
with our own code (the only lines of the block that differ, with `n`)."""

from datasets import Dataset
from openspiel_env import OpenSpielEnv
from openspiel_env.models import OpenSpielAction
from textarena_env import TextArenaAction, TextArenaEnv

WORDLE_URL = "https://openenv-wordle.hf.space"
CATCH_URL = "https://openenv-openspiel-env.hf.space"

wordle_prompt = """Play Wordle: find the hidden five-letter English word in six guesses.
After each guess you get one letter of feedback per position: G (right letter, right place),
Y (in the word, elsewhere) or X (not in the word). Make each guess with the tool `guess`, as [abcde]."""

catch_prompt = """Play Catch: a ball falls down a grid of 10 rows and 5 columns, and you move the paddle on
the bottom row. Catch the ball (+1) rather than miss it (-1). Use the tool `move` with "left" or "right",
or `stay` to let the ball fall one row."""

_ROWS, _COLS = 10, 5
_LEFT, _STAY, _RIGHT = 0, 1, 2  # OpenSpiel Catch's action ids


def _format_catch_obs(info_state) -> str:
    """The grid (row-major, 1.0 where the ball or the paddle is) as where the ball is from the paddle."""
    cells = [i for i, value in enumerate(info_state) if value == 1.0]
    ball = next((divmod(i, _COLS) for i in cells if i < (_ROWS - 1) * _COLS), None)
    paddle = next((i % _COLS for i in cells if i >= (_ROWS - 1) * _COLS), None)
    if ball is None or paddle is None:
        return "The ball has reached the bottom row."
    row, column = ball
    offset = column - paddle
    side = "above the paddle" if offset == 0 else f"{abs(offset)} column(s) {'right' if offset > 0 else 'left'} of the paddle"
    return f"Ball: row {row + 1} of {_ROWS}, column {column + 1} of {_COLS}, {side}.\nPaddle: column {paddle + 1}."


def _catch_step(env, action_id: int) -> str:
    if env.active != "catch":
        raise ValueError("this tool plays Catch; the game now is " + str(env.active))
    if env.done:
        raise ValueError("Game over.")
    result = env._catch_client.step(OpenSpielAction(action_id=action_id, game_name="catch"))
    env.reward = result.reward or 0.0
    env.done = result.observation.done
    return _format_catch_obs(result.observation.info_state)

# -- the guide's block --
class MultiEnv:
    def __init__(self):
        self._wordle_client = None
        self._catch_client = None
        self.active = None
        self.reward = 0.0
        self.done = False

    def reset(self, **kwargs) -> str | None:
        self.active = kwargs.get("env", "wordle")
        self.reward = 0.0
        self.done = False

        if self.active == "wordle":
            if self._wordle_client is not None:
                try:
                    self._wordle_client.close()
                except Exception:
                    pass
            self._wordle_client = TextArenaEnv(base_url=WORDLE_URL)
            result = self._wordle_client.reset()
            self._last_full_feedback = result.observation.messages[0].content
            self.reward = 0.0
            return self._last_full_feedback
        elif self.active == "catch":
            if self._catch_client is not None:
                try:
                    self._catch_client.close()
                except Exception:
                    pass
            self._catch_client = OpenSpielEnv(base_url=CATCH_URL)
            result = self._catch_client.reset()
            self.done = result.observation.done
            return _format_catch_obs(result.observation.info_state)

    # Wordle tool
    def guess(self, guess: str) -> str:
        """Make a guess in the Wordle environment.

        Args:
            guess: A five-letter word, as [abcde]
        """
        if self.active != "wordle":
            raise ValueError("this tool plays Wordle; the game now is " + str(self.active))
        if self.done:
            raise ValueError("Game over.")
        result = self._wordle_client.step(TextArenaAction(message=guess))
        text = result.observation.messages[0].content
        new, self._last_full_feedback = text[len(self._last_full_feedback):], text
        self.reward = 0.0 if "invalid move" in new.lower() else result.reward
        self.done = result.done
        return new

    # Catch tools
    def move(self, direction: str) -> str:
        """Move the paddle left or right.

        Args:
            direction: "left" or "right"
        """
        if direction not in ("left", "right"):
            raise ValueError(f"direction must be 'left' or 'right', not {direction!r}")
        return _catch_step(self, _LEFT if direction == "left" else _RIGHT)

    def stay(self) -> str:
        """Do nothing and let the ball fall one step."""
        return _catch_step(self, _STAY)

def wordle_reward(environments, **kwargs) -> list[float | None]:
    return [env.reward if env.active == "wordle" else None for env in environments]

def catch_reward(environments, **kwargs) -> list[float | None]:
    rewards = []
    for env in environments:
        if env.active != "catch":
            rewards.append(None)
        elif env.done:
            rewards.append(max(env.reward, 0.0))
        else:
            rewards.append(0.0)
    return rewards

n = 1
dataset = Dataset.from_dict({
    "prompt": (
        [[{"role": "user", "content": wordle_prompt}]] * n
        + [[{"role": "user", "content": catch_prompt}]] * n
    ),
    "env": ["wordle"] * n + ["catch"] * n,
})
