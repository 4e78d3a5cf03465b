"""The inspector's errors: each names the store, rollout or filter it is about."""

from __future__ import annotations


class InspectorError(Exception):
    """Base class of every error the inspector raises on purpose."""


class StoreUnavailable(InspectorError):
    """The store URL cannot be opened read-only, or its schema is not one this version reads."""


class RolloutNotFound(InspectorError, LookupError):
    def __init__(self, rollout_id: str):
        super().__init__(f"no rollout {rollout_id!r} in the trace store")
        self.rollout_id = rollout_id


class InvalidQuery(InspectorError, ValueError):
    """A filter, sort key or page the list cannot use; the message names which and why."""
