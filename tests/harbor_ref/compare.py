"""Compare our reading of a task with Harbor's, field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks import TaskError, load_task

MISSING = "<missing in ours>"


def differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Every field path where `ours` differs from Harbor's `theirs`; keys only we have are ignored
    (our extensions: reward_key, pids_limit, unknown keys we keep)."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{path or '.'}: ours {ours!r}, Harbor's {theirs!r}"]
        found: list[str] = []
        for key, value in theirs.items():
            where = f"{path}.{key}" if path else key
            found += differences(ours.get(key, MISSING), value, where)
        return found
    if isinstance(theirs, list) and isinstance(ours, list) and len(ours) == len(theirs):
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if ours != theirs:
        return [f"{path or '.'}: ours {ours!r}, Harbor's {theirs!r}"]
    return []


def compare_task(folder: Path, harbor: dict) -> list[str]:
    """How our `load_task` and Harbor's `Task` disagree about `folder` (empty: they agree)."""
    try:
        task = load_task(folder)
    except TaskError as exc:
        if harbor["ok"]:
            return [f"we refuse it ({exc}); Harbor loads it"]
        return []
    if not harbor["ok"]:
        return [f"we load it; Harbor refuses it ({harbor['error']})"]
    found = differences(task.config.model_dump(mode="json"), harbor["config"], "config")
    if task.name != harbor["name"]:
        found.append(f"name: ours {task.name!r}, Harbor's {harbor['name']!r}")
    if task.instruction != harbor["instruction"]:
        found.append("instruction: the texts differ")
    ours_steps = [{"name": s.name, "instruction": s.instruction} for s in task.steps]
    if ours_steps != harbor["steps"]:
        found.append(f"steps: ours {[s['name'] for s in ours_steps]}, Harbor's {[s['name'] for s in harbor['steps']]}")
    return found
