"""The async GRPO trainer, as a library: train a policy on validated rollout traces from a Harbor server.

    from functools import partial
    from harbor_server import HarborSessionFactory
    from trainer import AsyncGRPOConfig, HarnessAsyncGRPOTrainer

    factory = partial(HarborSessionFactory, "http://localhost:8200", split="builtin",
                      harness="mini-swe-agent", sandbox="docker", llm_url=vllm_url, model=name)
    config = AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, vllm_server_base_url=vllm)
    trainer = HarnessAsyncGRPOTrainer(model=path_or_module, harness_session_factory=factory,
                                      args=config, train_dataset=rows, rollout_reward_fn=my_reward)
    trainer.train()

- `HarnessAsyncGRPOTrainer` / `AsyncGRPOConfig`: the trainer and every knob it has (`trainer.config`).
- `HarnessRolloutOutcome`: what `rollout_reward_fn(outcome) -> float | None` receives.
- `run_sft(SFTConfig(...))`: the supervised warm-up on `harbor collect` episodes (`harbor sft`).
- `load_policy(path_or_hub_id)`: the model and tokenizer the trainer loads when given a name.
- Errors: `TrainerError` and its subclasses in `trainer.errors`.

Inside: `rollout_worker` (rollouts into groups, staleness), `advantages`, `packing`, `logprobs`, `loss`,
`distributed` (accelerate: DDP / FSDP2), `checkpoints`, `metrics` (trackio). It uses the server's client,
the capture layer's models and rows, and the engine's weight-transfer client (`engine.weight_client`).
Names are imported on first use, so `import trainer` does not load torch.
"""

import importlib
from typing import Any

_PUBLIC = {
    "AsyncGRPOConfig": "trainer.config",
    "HarnessAsyncGRPOTrainer": "trainer.grpo",
    "HarnessRolloutOutcome": "trainer.outcome",
    "SFTConfig": "trainer.sft",
    "SFTResult": "trainer.sft",
    "run_sft": "trainer.sft",
    "load_policy": "trainer.models",
    "TrainerError": "trainer.errors",
    "TrainerConfigError": "trainer.errors",
}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
