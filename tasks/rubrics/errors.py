"""Errors raised by rubrics and transforms, each saying which rubric and what went wrong."""

from __future__ import annotations


class RubricError(Exception):
    """Base class for reward-composition failures."""


class RubricConfigError(RubricError, ValueError):
    """A rubric was built with arguments it cannot work with (weights that do not match, ...)."""


class RubricCallError(RubricError):
    """A rubric was called the wrong way (a sync call into an async rubric, a container as a scorer)."""


class JudgeError(RubricError):
    """An LLM judge's reply held no score that can be read; the reward cannot be computed."""
