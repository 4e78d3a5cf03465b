"""Device placement: `auto` resolves to CUDA only when torch sees a GPU, a requested but missing GPU is a
clear error (in the library and as one CLI line), bf16 follows TRL's default on CUDA, and the model is
moved to the chosen device before training and reported at start-up."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from harbor_rl.cli import app
from trainer.config import AsyncGRPOConfig
from trainer.device import resolve_device, resolve_placement
from trainer.distributed import SingleProcess
from trainer.errors import TrainerConfigError
from trainer.grpo import HarnessAsyncGRPOTrainer

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the missing-GPU error")


@pytest.mark.parametrize(
    ("requested", "cuda_available", "expected"),
    [("auto", False, "cpu"), ("auto", True, "cuda"), ("cpu", True, "cpu"), ("cpu", False, "cpu"),
     ("cuda", True, "cuda")],
)  # fmt: skip
def test_auto_takes_the_gpu_only_when_there_is_one(requested, cuda_available, expected) -> None:
    assert resolve_device(requested, cuda_available=cuda_available).type == expected


def test_a_requested_gpu_that_is_missing_is_a_clear_error() -> None:
    with pytest.raises(
        TrainerConfigError, match=r"device 'cuda' was asked for but torch sees no GPU.*--device cpu"
    ):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(TrainerConfigError, match="expected auto, cpu or cuda"):
        resolve_device("tpu")  # type: ignore[arg-type]


def test_bf16_defaults_to_on_with_cuda_and_off_on_the_cpu_unless_set() -> None:
    assert AsyncGRPOConfig().bf16 is None and AsyncGRPOConfig().device == "auto"
    assert resolve_placement("auto", None, cuda_available=True).bf16 is True
    assert resolve_placement("auto", None, cuda_available=False).bf16 is False
    assert resolve_placement("auto", False, cuda_available=True).bf16 is False
    assert resolve_placement("cpu", True, cuda_available=False).bf16 is True


def test_one_process_moves_the_model_to_its_device() -> None:
    model = torch.nn.Linear(3, 2)
    # "meta" stands in for a GPU here: a real move of every parameter, with no accelerator needed.
    moved = SingleProcess("meta").place(model)
    assert {p.device.type for p in moved.parameters()} == {"meta"}


def _trainer(model, **config) -> HarnessAsyncGRPOTrainer:
    args = AsyncGRPOConfig(vllm_server_base_url=None, report_to="none", num_generations=2,
                           per_device_train_batch_size=2, **config)  # fmt: skip
    return HarnessAsyncGRPOTrainer(model, lambda **_: None, args, train_dataset=[{"prompt": "x"}])


def test_the_trainer_takes_and_reports_the_device_choice(tiny_model) -> None:
    model, _ = tiny_model
    trainer = _trainer(model, device="cpu")
    assert trainer.placement.device.type == "cpu" and trainer.placement.bf16 is False
    assert trainer.processes.device.type == "cpu"
    # The optimizer is built over the placed parameters (a move may replace them).
    params = trainer.optimizer.param_groups[0]["params"]
    assert all(p is q for p, q in zip(params, trainer.model.parameters(), strict=True))
    assert trainer.placement.describe(model) == "training on cpu, weights float32, no autocast"
    bf16 = _trainer(model, device="cpu", bf16=True)
    assert bf16.placement.describe(model).endswith("bf16 autocast")


@needs_no_gpu
def test_the_trainer_refuses_cuda_without_a_gpu(tiny_model) -> None:
    with pytest.raises(TrainerConfigError, match="torch sees no GPU"):
        _trainer(tiny_model[0], device="cuda")


@needs_no_gpu
def test_harbor_train_refuses_cuda_without_a_gpu_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(app, ["train", "--device", "cuda", "--output-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "torch sees no GPU" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything started


@needs_no_gpu
def test_the_embedded_engine_refuses_cuda_without_a_gpu(tiny_dir) -> None:
    from engine.config import EngineConfig, engine_device, load_engine
    from engine.errors import EngineConfigError

    assert engine_device("auto").type == "cpu"
    with pytest.raises(EngineConfigError, match="torch sees no GPU"):
        load_engine(EngineConfig(model=str(tiny_dir), device="cuda"))
    result = CliRunner().invoke(app, ["engine", "--model", str(tiny_dir), "--device", "cuda"])
    assert result.exit_code == 2 and "torch sees no GPU" in result.output
