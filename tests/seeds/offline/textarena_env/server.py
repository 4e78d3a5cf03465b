"""The TextArena environment server, in this process: the real TextArena game (the `textarena` package,
0.7.4) made with `textarena.make("Wordle-v0")`, with the wrappers that registration gives it
(LLMObservationWrapper, ActionFormattingWrapper), turned into observations the way OpenEnv's server
does (meta-pytorch/OpenEnv at 685de411, `envs/textarena_env/server/environment.py`):

- `reset()` clears the wrappers' accumulated observations, then resets the game; the observation's
  reward is 0.0 and done False.
- `step()` passes the message to the game; the observation's reward is the game's reward for player 0
  once it has one (1 for a win; the share of letters matched when the guesses run out), else 0.0.
- `messages`: LLMObservationWrapper gives the player's whole game so far as one string, and the server's
  message conversion buffers consecutive parts of one sender and category, so the string becomes a single
  message (sender -1, category MESSAGE): `messages[0].content` is the cumulative game text.
- `prompt`: at turn 0, that first message; later the env id (no message is typed PROMPT).

One thing differs, because it cannot be fetched offline: TextArena's Wordle loads NLTK's `words` corpus
(the secrets are the 5-letter nouns of its `en-basic` list, by NLTK's tagger, and a guess is valid if
it is in its hunspell en_US/en_GB dictionaries or in NLTK's `en` list) and downloads it and the tagger
on first use. Here the secrets are `WORDS`, 5-letter nouns of Ogden's Basic English (which `en-basic`
is), and validity is the hunspell dictionaries that ship inside the package; no download is attempted.
"""

from __future__ import annotations

import functools
import threading
import uuid
from contextlib import contextmanager
from typing import Any
from unittest import mock

from textarena_env.models import TextArenaAction, TextArenaMessage, TextArenaObservation, TextArenaState

ENV_ID = "Wordle-v0"
WORDS: tuple[str, ...] = (
    "brain", "bread", "brick", "chain", "chalk", "clock", "cloud", "crime", "dress", "earth",
    "field", "flame", "floor", "fruit", "glass", "grass", "heart", "horse", "house", "knife",
    "light", "money", "mouth", "night", "paper", "plane", "plant", "plate", "river", "shirt",
    "smoke", "snake", "stamp", "steam", "stone", "sugar", "table", "thumb", "train", "wheel",
)  # fmt: skip
"""The secret words a game draws from (a test may set this to one word to know the secret)."""

_LOCK = threading.Lock()


@contextmanager
def _offline_nltk() -> Any:
    """NLTK's downloader answers False (as it does when its host is unreachable) without trying."""
    import nltk

    with mock.patch.object(nltk, "download", return_value=False):
        yield


@functools.cache
def _dictionary() -> Any:
    """TextArena's EnglishDictionary from the hunspell files it ships (NLTK's lists left out), built once."""
    with _offline_nltk():
        from textarena.envs.utils.word_lists import EnglishDictionary

        return EnglishDictionary(keep_proper_nouns=False, include_nltk=False)


def make_wordle() -> Any:
    """`textarena.make("Wordle-v0")`, its word lists as the module docstring says."""
    with _LOCK, _offline_nltk():
        import textarena
        from textarena.envs.Wordle import env as wordle

        def word_list(game: Any, hardcore: bool = False) -> None:
            game.word_list = list(WORDS)

        with (
            mock.patch.object(wordle.WordleEnv, "_load_word_list", word_list),
            mock.patch.object(wordle, "EnglishDictionary", lambda **kwargs: _dictionary()),
        ):
            return textarena.make(ENV_ID)


class TextArenaEnvironment:
    """One session's game, with OpenEnv's server's reset/step/state."""

    def __init__(self) -> None:
        self._game = make_wordle()
        self._state = TextArenaState(env_id=ENV_ID, num_players=1)
        self._game.reset(num_players=1)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> TextArenaObservation:
        layer = self._game
        while layer is not None:  # the wrappers keep the whole history across resets otherwise
            if hasattr(layer, "full_observations"):
                layer.full_observations = {}
            layer = getattr(layer, "env", None)
        self._game.reset(num_players=1)
        self._state = TextArenaState(
            env_id=ENV_ID,
            num_players=1,
            episode_id=episode_id or str(uuid.uuid4()),
            raw_state=self._snapshot(),
        )
        observation = self._observation()
        observation.reward, observation.done = 0.0, False
        return observation

    def step(self, action: TextArenaAction) -> TextArenaObservation:
        if not isinstance(action, TextArenaAction):
            raise TypeError(f"Expected TextArenaAction, received {type(action)!r}")
        done, info = self._game.step(action.message)
        self._state.step_count += 1
        self._state.turn = getattr(self._game.state, "turn", self._state.turn + 1)
        self._state.last_info = info or {}
        observation = self._observation()
        observation.done = done
        observation.reward = self._state.last_reward = self._reward()
        self._state.raw_state = self._snapshot()
        return observation

    @property
    def state(self) -> TextArenaState:
        return self._state

    def _observation(self) -> TextArenaObservation:
        player_id, text = self._game.get_observation()
        messages = [TextArenaMessage(sender_id=-1, content=str(text), category="MESSAGE")] if text else []
        turn = getattr(self._game.state, "turn", 0)
        prompt = messages[0].content if turn == 0 and messages else ENV_ID
        return TextArenaObservation(
            prompt=prompt.strip(),
            messages=messages,
            current_player_id=player_id,
            legal_players=sorted(
                p for p in (self._game.state.role_mapping or {}) if isinstance(p, int) and p >= 0
            ),
            info=dict(getattr(self._game.state, "step_info", {}) or {}),
            metadata={"env_id": ENV_ID, "turn": turn},
        )

    def _reward(self) -> float:
        rewards = getattr(self._game.state, "rewards", None)
        if isinstance(rewards, dict) and 0 in rewards:
            return float(rewards[0])
        return 0.0

    def _snapshot(self) -> dict[str, Any]:
        state = self._game.state
        return {
            "turn": getattr(state, "turn", 0),
            "game_state": getattr(state, "game_state", {}),
            "rewards": getattr(state, "rewards", None),
            "done": getattr(state, "done", False),
        }
