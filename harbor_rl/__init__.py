"""Harbor-RL's command line (`harbor`), and the applications built from the other packages: the
`harbor train` pipeline (`train_pipeline`: embedded engine and server, warm-up, GRPO, evaluations),
launching on Hugging Face Jobs (`jobs`), TRL's `GRPOTrainer` / `GRPOConfig` for the white-box
`environment_factory` path (`grpo_trainer`), and TRL's `HarnessAsyncGRPOTrainer` / `AsyncGRPOConfig` for
the black-box harness path (`harness_trainer`). It sits on top: nothing else imports it."""

from __future__ import annotations

from typing import Any


def _version() -> str:
    """The installed distribution's version; in a source tree that was never installed, pyproject's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harbor-rl")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        try:
            with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
                return str(tomllib.load(f)["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"


__version__ = _version()

_PUBLIC = {
    "GRPOConfig": "harbor_rl.grpo_trainer",
    "GRPOTrainer": "harbor_rl.grpo_trainer",
    "AsyncGRPOConfig": "harbor_rl.harness_trainer",
    "HarnessAsyncGRPOTrainer": "harbor_rl.harness_trainer",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    # Imported on first use: `harbor --help` must not pay for torch and the server.
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'harbor_rl' has no attribute {name!r}")
