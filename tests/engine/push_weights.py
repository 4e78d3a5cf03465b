"""A separate trainer process for the weight-sync tests: loads the tiny model, changes it, and pushes
it to the engine with `engine.weight_client` over gloo. Prints one JSON line with the outcome.

    python -m tests.engine.push_weights MODEL_DIR ENGINE_URL {good|bad-shape|twice|plain|small-chunks|die}

Pushes are packed (TRL's `packed: true` in init_info) unless the mode says otherwise. `twice` pushes
versions 1 and 2 through one transfer group; `plain` sends one tensor per broadcast; `small-chunks`
packs into 64 KiB buffers, so the model travels as many chunks cut the way vLLM cuts them. `die` exits hard
halfway through sending the tensors: a trainer crashing mid-update.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from engine.errors import WeightSyncError
from engine.tiny_model import load_model_and_tokenizer
from engine.weight_client import WeightSyncClient

PERTURB_SEED = 1234


def perturbed(model_dir: str, step: int = 1) -> torch.nn.Module:
    """The tiny model after `step` fake optimiser steps (deterministic, shared with the test)."""
    model, _ = load_model_and_tokenizer(model_dir)
    generator = torch.Generator().manual_seed(PERTURB_SEED)
    with torch.no_grad():
        for _ in range(step):
            for _, param in model.named_parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


class DieHalfway:
    """Weights whose iteration kills the process halfway: a trainer crashing mid-update, after the
    engine has started receiving."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.named = named

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(n, t.dtype, tuple(t.shape)) for n, t in self.named]

    def __iter__(self):
        for index, (name, tensor) in enumerate(self.named):
            if index == len(self.named) // 2:
                print(json.dumps({"died_after": index}), flush=True)
                os._exit(0)
            yield name, tensor.detach()


def main() -> None:
    model_dir, url, mode = sys.argv[1:4]
    torch.set_num_threads(1)
    model = perturbed(model_dir)
    named = list(model.named_parameters())
    if mode == "bad-shape":  # a trainer bug: one tensor has the wrong shape
        name, param = named[3]
        named[3] = (name, torch.zeros(param.shape[0] + 1, *param.shape[1:]))
    options = {"plain": {"packed": False}, "small-chunks": {"packed_buffer_size_bytes": 64 * 1024},
               "die": {"packed": False}}  # fmt: skip
    with WeightSyncClient(url, backend="gloo", timeout_s=60, **options.get(mode, {})) as sync:
        try:
            versions = [sync.push(DieHalfway(named) if mode == "die" else named, version=1)]
            if mode == "twice":
                versions.append(sync.push(perturbed(model_dir, step=2).named_parameters(), version=2))
        except WeightSyncError as exc:
            print(json.dumps({"error": str(exc), "step": exc.step, "paused": exc.paused}))
            return
    print(json.dumps({"versions": versions}))


if __name__ == "__main__":
    main()
