"""The Gradio trace inspector (docs/design.md 3.11): browse rollouts in a trace store, read-only.

    harbor inspect --store sqlite:///runs/traces.db
    mount_inspector(fastapi_app, store_url, path="/inspect")   # inside another server

Gradio is imported only by `inspector.app`; queries and rendering work without it.
"""

from __future__ import annotations

from typing import Any

from inspector.errors import InspectorError, InvalidQuery, RolloutNotFound, StoreUnavailable
from inspector.queries import RolloutQuery, list_rollouts, load_rollout, reward_by_policy_version

__all__ = [
    "InspectorError",
    "InvalidQuery",
    "RolloutNotFound",
    "RolloutQuery",
    "StoreUnavailable",
    "create_inspector",
    "list_rollouts",
    "load_rollout",
    "mount_inspector",
    "reward_by_policy_version",
]


def create_inspector(store_url: str, **kwargs: Any) -> Any:
    """The Gradio Blocks (see inspector.app.create_inspector)."""
    from inspector.app import create_inspector as create

    return create(store_url, **kwargs)


def mount_inspector(app: Any, store_url: str, path: str = "/inspect", **kwargs: Any) -> Any:
    """Mount the inspector in a FastAPI app under `path` (see inspector.app.mount_inspector)."""
    from inspector.app import mount_inspector as mount

    return mount(app, store_url, path, **kwargs)
