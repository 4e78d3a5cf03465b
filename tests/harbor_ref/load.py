"""Runs in Harbor's own venv (not ours): load task folders with Harbor's `Task` and print, one JSON line
per folder, what Harbor resolved. Argument: {"folders": [...], "env": {...}} as JSON."""

import json
import os
import sys
import warnings

from harbor.models.task.task import Task  # harbor/models/task/task.py
from harbor.utils.env import resolve_env_vars  # harbor/utils/env.py


def read(folder: str) -> dict:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # allow_internet, memory, storage
            task = Task(folder)
    except Exception as exc:  # Harbor raises ValidationError, FileNotFoundError, ValueError...
        return {"folder": folder, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    config = task.config
    try:
        env = resolve_env_vars(config.environment.env)
        env_error = None
    except ValueError as exc:
        env, env_error = None, str(exc)
    return {
        "folder": folder,
        "ok": True,
        "config": config.model_dump(mode="json"),
        "name": task.name,
        "instruction": task.instruction,
        "steps": [
            {"name": step.name, "instruction": task.step_instruction(step.name)} for step in config.steps or []
        ],
        "resolved_env": env,
        "env_error": env_error,
    }


def main() -> None:
    request = json.loads(sys.argv[1])
    os.environ.update(request["env"])
    for folder in request["folders"]:
        print(json.dumps(read(folder)))


if __name__ == "__main__":
    main()
