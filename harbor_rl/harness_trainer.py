"""TRL's black-box trainer as this package offers it: `HarnessAsyncGRPOTrainer` (TRL's
`trl.experimental.async_grpo.openenv_harness`) and its `AsyncGRPOConfig` (TRL's `from trl import
AsyncGRPOConfig`), so the guide's block runs with `from harbor_rl import ...`.

They are the trainer library's (`trainer`), with one thing more: `model="tiny"` names the embedded
engine's built-in model, the one `harbor engine tiny` serves, as it does for `GRPOTrainer`. Its folder
is the tiny model of seed 0, `harbor engine`'s default; the trainer pushes its weights to the engine
before the first rollout either way, so the two serve the same policy from the start. `"smollm2-135m"`
and a `.gguf` path are resolved to their built folders the same way (engine.tiny_model.resolve_model_path).
"""

from __future__ import annotations

from typing import Any

from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer as _LibraryTrainer

__all__ = ["AsyncGRPOConfig", "HarnessAsyncGRPOTrainer"]

TINY_SEED = 0
"""The seed of the tiny model `model="tiny"` loads: `harbor engine tiny`'s default `--seed`."""


class HarnessAsyncGRPOTrainer(_LibraryTrainer):
    """`trainer.HarnessAsyncGRPOTrainer`, taking `model="tiny"` too (see the module docstring)."""

    def __init__(self, model: Any, harness_session_factory: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(model, str) and (model in ("tiny", "smollm2-135m") or model.lower().endswith(".gguf")):
            from engine.tiny_model import resolve_model_path

            model = str(resolve_model_path(model, TINY_SEED))
        super().__init__(model, harness_session_factory, *args, **kwargs)
