"""Agent harnesses: how each agent is installed into a sandbox image, pointed at the proxy, and run.

    from harnesses import get_harness, AgentRun
    harness = get_harness("mini-swe-agent")
    layer = harness.image_layer()          # goes into SandboxSpec.image_layers
    outcome = await harness.run(sandbox, AgentRun(instruction=..., base_url=..., api_key=..., model=...))

Harness modules are imported on first use, so listing names costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from harnesses.base import AgentOutcome, AgentRun, Harness
from harnesses.errors import HarnessAssetError, HarnessConfigError, HarnessError, UnknownHarness
from sandboxes.base import ImageLayer

_REGISTRY: dict[str, str | Callable[[], Harness]] = {
    "nop": "harnesses.nop:NopHarness",
    "oracle": "harnesses.oracle:OracleHarness",
    "mini-swe-agent": "harnesses.mini_swe_agent:MiniSweAgentHarness",
    "opencode": "harnesses.opencode:OpenCodeHarness",
    "claude-code": "harnesses.claude_code:ClaudeCodeHarness",
    "codex": "harnesses.codex:CodexHarness",
    "qwen-code": "harnesses.qwen_code:QwenCodeHarness",
    "env-factory": "harnesses.env_factory.harness:EnvFactoryHarness",
}

HARNESS_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""The built-in harness names (see `harness_names()` for ones registered later)."""
MODEL_FREE_HARNESSES = frozenset({"nop", "oracle"})
"""Harnesses that never call a model: one step, no engine needed (they check a task and its verifier)."""


def harness_names() -> list[str]:
    """Every harness name that `get_harness` accepts, built-in and registered."""
    return list(_REGISTRY)


def register_harness(name: str, factory: Callable[[], Harness]) -> None:
    """Make `get_harness(name)` return `factory()` (e.g. the white-box env-factory harness)."""
    _REGISTRY[name] = factory


def get_harness(name: str) -> Harness:
    """A fresh harness instance for `name`; UnknownHarness (a KeyError) lists the valid names."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise UnknownHarness(name, harness_names()) from None
    if callable(target):
        return target()
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)()


def prepare_image_layers(names: list[str]) -> dict[str, ImageLayer | None]:
    """Each harness's image layer, fetching its pinned packages onto the host now (blocking: minutes the
    first time, instant once cached). Call it at start-up, in a thread, so no rollout waits for it."""
    return {name: get_harness(name).image_layer() for name in names}


__all__ = [
    "HARNESS_NAMES",
    "MODEL_FREE_HARNESSES",
    "AgentOutcome",
    "AgentRun",
    "Harness",
    "HarnessAssetError",
    "HarnessConfigError",
    "HarnessError",
    "UnknownHarness",
    "get_harness",
    "harness_names",
    "prepare_image_layers",
    "register_harness",
]
