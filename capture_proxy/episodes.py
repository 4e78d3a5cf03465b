"""The SFT episode format: one line of `results.jsonl` as `harbor collect` writes it and `harbor sft`
reads it (`episode_id`, `messages`, `reward`, `done`, `tool_trace`, `metrics`, `verify_metrics`,
`artifacts`, `task`, `extra`, `tools`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError


class CorruptLineWarning(UserWarning):
    """A results.jsonl line that is not a valid episode; it is skipped."""


class Episode(BaseModel):
    """One line of results.jsonl."""

    episode_id: str
    messages: list[dict[str, Any]]
    reward: float | None
    done: bool
    """The rollout completed (not timed out, failed or cancelled)."""
    tool_trace: list[dict[str, Any]]
    """Every tool call in order: name, arguments, output (None when the episode ended before it was shown)."""
    metrics: dict[str, Any]
    verify_metrics: dict[str, float]
    artifacts: dict[str, Any]
    task: dict[str, Any]
    extra: dict[str, Any]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The tool schemas offered on the model's last call (TRL's `tools` column), so SFT renders the
    prompt the policy will see; [] when none were offered."""


def read_episodes(path: Path) -> list[Episode]:
    """Every valid episode of a results.jsonl, first line of an id wins; each corrupt or repeated line is
    skipped with a CorruptLineWarning that names the file and line (bad lines are not fatal)."""
    episodes: dict[str, Episode] = {}
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            episode = Episode.model_validate_json(line)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"] if exc.errors() else str(exc)
            warnings.warn(
                f"{path}:{number}: skipping a corrupt line ({reason})", CorruptLineWarning, stacklevel=2
            )
            continue
        if episode.episode_id in episodes:
            warnings.warn(
                f"{path}:{number}: skipping a second line for {episode.episode_id}",
                CorruptLineWarning,
                stacklevel=2,
            )
            continue
        episodes[episode.episode_id] = episode
    return list(episodes.values())
