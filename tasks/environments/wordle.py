"""`WordleEnv`: a Wordle-like word game with partial credit, small enough for a tiny model to learn.

The model guesses with the `guess` tool; each guess gets per-letter feedback (G right place, Y in the
word elsewhere, X absent). Rewards come from rubrics, as TRL's Wordle example splits them:

- `reward_win`: 1 + 0.5 * (1 - guesses / max_guesses) for a win (faster is better), else 0;
- `reward_partial`: for a loss, the best guess's letter credit (greens + yellows / 2) / length;
- `reward_invalid`: -0.1 per invalid guess (wrong length, not letters, after the game ended).

`reward` is their sum. A guess after the game ended raises ValueError("Game over."), which the loop
sends back as the tool message and counts as a tool failure.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tasks.rubrics import ExponentialDiscountingTrajectoryRubric, Rubric

WORDS = (
    "crane", "slate", "plant", "house", "brick", "cloud", "grape", "train", "shirt", "flame",
    "stone", "light", "water", "bread", "chair", "table", "mouse", "horse", "sugar", "lemon",
)  # fmt: skip
MAX_GUESSES = 6
INVALID_PENALTY = 0.1


def feedback(guess: str, secret: str) -> str:
    """Per-letter G/Y/X, with Wordle's rule for repeated letters (greens first, then yellows by count)."""
    marks = ["X"] * len(guess)
    left = Counter(s for g, s in zip(guess, secret, strict=True) if g != s)
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
        elif left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


class LetterCredit(Rubric):
    """(greens + yellows / 2) / length of one guess: partial credit before the word is found."""

    def forward(self, action: str, observation: dict[str, Any]) -> float:
        marks = observation["feedback"]
        return (marks.count("G") + 0.5 * marks.count("Y")) / len(marks)


class WordleRubric(ExponentialDiscountingTrajectoryRubric):
    """Per guess: letter credit as the intermediate signal; at the end, the win bonus or best credit."""

    def __init__(self, gamma: float = 0.9) -> None:
        super().__init__(gamma=gamma)
        self.letters = LetterCredit()
        self.best_credit = 0.0

    def forward(self, action: str, observation: dict[str, Any]) -> float:
        self.best_credit = max(self.best_credit, self.letters(action, observation))
        return super().forward(action, observation)

    def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
        _, last = trajectory[-1]
        if last["won"]:
            return 1.0 + 0.5 * (1 - len(trajectory) / MAX_GUESSES)
        return self.best_credit

    def reset(self) -> None:
        super().reset()
        self.best_credit = 0.0


class WordleEnv:
    """Find the secret word in MAX_GUESSES guesses with the `guess` tool."""

    def __init__(self) -> None:
        self.rubric = WordleRubric()
        self._reset_state("crane")

    def _reset_state(self, secret: str) -> None:
        self.secret = secret
        self.guesses: list[str] = []
        self.num_guesses = 0
        """Valid guesses so far; with `won`, `best_greens` and `invalid_moves`, the state TRL's guide's
        reward functions read (its WordleEnv's names)."""
        self.best_greens = 0
        """The most letters in the right place of any guess."""
        self.invalid_moves = 0
        self.won = False
        self.done = False
        self.final_score: float | None = None

    def reset(self, secret: str | None = None, seed: int | None = None, **kwargs: Any) -> str | None:
        if secret is None:
            secret = random.Random(seed).choice(WORDS) if seed is not None else random.choice(WORDS)
        secret = secret.strip().lower()
        if not secret.isalpha():
            raise ValueError(f"the secret word must be letters only, got {secret!r}")
        self.rubric.reset()
        self._reset_state(secret)
        return (
            f"Guess the secret {len(secret)}-letter word in {MAX_GUESSES} tries. Call the guess tool with a "
            "word; feedback per letter: G = right letter, right place; Y = in the word, elsewhere; "
            "X = not in the word."
        )

    def guess(self, guess: str) -> str:
        """
        Make a guess in the word game.

        Args:
            guess: The guessed word, as many letters as the secret word (e.g. crane or [crane])

        Returns:
            The feedback for each letter of the guess.
        """
        if self.done:
            self.invalid_moves += 1
            raise ValueError("Game over.")
        candidate = str(guess).strip().strip("[]").lower()
        if len(candidate) != len(self.secret) or not candidate.isalpha():
            self.invalid_moves += 1
            raise ValueError(f"invalid guess {guess!r}: guess a {len(self.secret)}-letter word")
        marks = feedback(candidate, self.secret)
        self.guesses.append(candidate)
        self.num_guesses = len(self.guesses)
        self.best_greens = max(self.best_greens, marks.count("G"))
        self.won = candidate == self.secret
        self.done = self.won or len(self.guesses) >= MAX_GUESSES
        score = self.rubric(candidate, {"feedback": marks, "done": self.done, "won": self.won})
        if self.done:
            self.final_score = score
        lines = [" ".join(candidate.upper()), " ".join(marks)]
        if self.won:
            lines.append(f"You found the word in {len(self.guesses)} guesses.")
        elif self.done:
            lines.append(f"Game over. The word was {self.secret}.")
        else:
            lines.append(f"{MAX_GUESSES - len(self.guesses)} guesses left.")
        return "\n".join(lines)

    # Reward terms (properties are not tools: only public methods are).

    @property
    def reward_win(self) -> float:
        return self.final_score if self.won and self.final_score is not None else 0.0

    @property
    def reward_partial(self) -> float:
        return 0.0 if self.won else self.rubric.best_credit

    @property
    def reward_invalid(self) -> float:
        return -INVALID_PENALTY * self.invalid_moves if self.invalid_moves else 0.0  # never -0.0

    @property
    def reward(self) -> float:
        return self.reward_win + self.reward_partial + self.reward_invalid


def _term(name: str):
    def reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return [getattr(env, name) if isinstance(env, WordleEnv) else None for env in environments]

    reward.__name__ = f"wordle_{name.removeprefix('reward_')}"
    return reward


wordle_win = _term("reward_win")
wordle_partial = _term("reward_partial")
wordle_invalid = _term("reward_invalid")
