"""Where the policy trains: the device choice (`auto`, `cpu`, `cuda`) and the precision that goes with it.

    placement = resolve_placement(config.device, config.bf16)   # auto: cuda when torch sees a GPU
    model.to(placement.device)

`auto` is CUDA when torch sees a GPU, else the CPU. bf16 autocast defaults to on where it is fast (CUDA,
as TRL's GRPO configs default `bf16=True`) and off on the CPU (there it is slower and less exact);
weights stay in their loaded dtype either way, as under TRL's mixed precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from trainer.errors import TrainerConfigError

DeviceChoice = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class Placement:
    device: torch.device
    bf16: bool
    """Forward passes under bfloat16 autocast."""

    def describe(self, model: torch.nn.Module) -> str:
        """One start-up line: the device, the weights' dtype and the autocast."""
        param = next(model.parameters(), None)
        dtype = str(param.dtype).removeprefix("torch.") if param is not None else "-"
        name = f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        autocast = "bf16 autocast" if self.bf16 else "no autocast"
        return f"training on {self.device}{name}, weights {dtype}, {autocast}"


def resolve_device(requested: DeviceChoice, *, cuda_available: bool | None = None) -> torch.device:
    """`auto` -> cuda when torch sees a GPU, else cpu; `cuda` without one is a TrainerConfigError."""
    if requested not in ("auto", "cpu", "cuda"):
        raise TrainerConfigError(f"device {requested!r}: expected auto, cpu or cuda")
    if requested == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if requested == "cuda" and not available:
        raise TrainerConfigError(
            "device 'cuda' was asked for but torch sees no GPU "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}): "
            "install a CUDA build of torch, check CUDA_VISIBLE_DEVICES, or use --device cpu / auto"
        )
    # "cuda" is torch's current device: the one process's GPU, or LOCAL_RANK's under accelerate.
    return torch.device("cuda") if available else torch.device("cpu")


def resolve_placement(
    requested: DeviceChoice, bf16: bool | None, *, cuda_available: bool | None = None
) -> Placement:
    """The device, and bf16 autocast: as asked, or (None) on for CUDA and off for the CPU."""
    device = resolve_device(requested, cuda_available=cuda_available)
    return Placement(device=device, bf16=device.type == "cuda" if bf16 is None else bf16)
