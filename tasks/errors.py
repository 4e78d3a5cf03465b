"""Errors raised by the task layer, each naming what is wrong and where."""

from __future__ import annotations

from pathlib import Path


class TaskError(Exception):
    """Base class for task and dataset failures."""


class TaskFormatError(TaskError):
    """A task folder or one of its files is malformed.

    `file` is the offending file (or folder), `key` the TOML key, Dockerfile instruction or row field
    at fault (None when the whole file is), `problem` what is wrong, in words a task author can act on.
    """

    def __init__(
        self, file: str | Path, problem: str, key: str | None = None, *, shown_key: str | None = None
    ) -> None:
        """`shown_key`: how the key reads in the message, when not as `key` (a TOML key as the file
        writes it: `[environment] memory_mb`)."""
        self.file = str(file)
        self.key = key
        self.problem = problem
        shown = shown_key or key
        super().__init__(f"{self.file}: {shown}: {problem}" if shown else f"{self.file}: {problem}")


class DatasetError(TaskError):
    """A dataset spec cannot be resolved (unknown source, missing split, duplicate task ids...)."""


class TaskNotFound(DatasetError):
    """A task id or index that the dataset does not hold."""


class TaskEnvError(TaskError):
    """A task's `${VAR}` needs a host environment variable that is not set (never names its value)."""


class UnsupportedTaskFeature(TaskError):
    """The task uses a Harbor feature this run cannot honour (the message says which and what to do)."""
