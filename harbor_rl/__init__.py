"""Harbor-RL's command line (`harbor`), and the applications built from the other packages: the
`harbor train` pipeline (`train_pipeline`: embedded engine and server, warm-up, GRPO, evaluations),
launching on Hugging Face Jobs (`jobs`), and TRL's `GRPOTrainer` / `GRPOConfig` for the white-box
`environment_factory` path (`grpo_trainer`). It sits on top: nothing else imports it."""

from __future__ import annotations

from typing import Any

__all__ = ["GRPOConfig", "GRPOTrainer"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `harbor --help` must not pay for torch and the server.
    if name in __all__:
        from harbor_rl import grpo_trainer

        return getattr(grpo_trainer, name)
    raise AttributeError(f"module 'harbor_rl' has no attribute {name!r}")
