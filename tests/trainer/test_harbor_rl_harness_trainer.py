"""`from harbor_rl import AsyncGRPOConfig, HarnessAsyncGRPOTrainer`: TRL's black-box trainer where the
guide's `from trl ...` lines find it, the trainer library's own, taking `model="tiny"` as `harbor engine
tiny` serves it."""

from __future__ import annotations

import pytest
import torch

import trainer
from engine.tiny_model import build_tiny_model
from harbor_rl import AsyncGRPOConfig, HarnessAsyncGRPOTrainer
from trainer.errors import TrainerConfigError
from trainer.models import load_policy


def test_they_are_the_trainer_librarys() -> None:
    assert AsyncGRPOConfig is trainer.AsyncGRPOConfig
    assert issubclass(HarnessAsyncGRPOTrainer, trainer.HarnessAsyncGRPOTrainer)


def test_model_tiny_is_the_tiny_model_harbor_engine_serves(tmp_path) -> None:
    args = AsyncGRPOConfig(output_dir=str(tmp_path), vllm_server_base_url=None)
    built = HarnessAsyncGRPOTrainer("tiny", lambda **_: None, args, train_dataset=[{"prompt": "x"}])
    served, _ = load_policy(build_tiny_model(0))  # `harbor engine tiny`: --seed 0
    assert built.tokenizer is not None
    for (name, ours), (_, theirs) in zip(
        built.model.named_parameters(), served.named_parameters(), strict=True
    ):
        assert torch.equal(ours, theirs), name


def test_another_name_is_loaded_as_the_library_loads_it(tmp_path) -> None:
    args = AsyncGRPOConfig(output_dir=str(tmp_path), vllm_server_base_url=None)
    with pytest.raises(TrainerConfigError, match="cannot load model"):
        HarnessAsyncGRPOTrainer(
            str(tmp_path / "nowhere"), lambda **_: None, args, train_dataset=[{"prompt": "x"}]
        )
