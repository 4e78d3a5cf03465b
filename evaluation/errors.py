"""Errors of `harbor eval` and `harbor collect`, each with a message a user can act on."""

from __future__ import annotations


class EvaluationError(Exception):
    """Base of every error this package raises."""


class JobConfigMismatch(EvaluationError):
    """`--resume` of a job whose stored config.json asks for a different run."""


class JobNotFound(EvaluationError):
    """A jobs folder or job that does not exist (or has no config.json)."""


class NoTasksSelected(EvaluationError):
    """The datasets and --task patterns left nothing to run."""


class DatasetMisaligned(EvaluationError):
    """An existing results.jsonl whose episodes do not map to the same tasks as this run's plan."""


class ProviderError(EvaluationError):
    """A teacher provider that cannot be used as configured (e.g. no --llm-url for `openai`)."""


class ConflictingOptions(EvaluationError):
    """Options that cannot go together (e.g. --store with --base-url: the server keeps its own store)."""


class UnknownChoice(EvaluationError):
    """A harness or sandbox name that does not exist; the message lists the valid ones."""


class MissingEngine(EvaluationError, ValueError):
    """A harness that calls a model, run without --llm-url or --model (a ValueError, as it was)."""


class NotAHarborServer(EvaluationError):
    """A `--base-url` that answers, but not as a `harbor serve` (an OpenEnv environment server, say)."""
