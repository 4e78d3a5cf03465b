"""A separate trainer process for the weight-sync tests: loads the tiny model, changes it, and pushes
it to the engine with `engine.weight_client` over gloo. Prints one JSON line with the outcome.

    python -m tests.engine.push_weights MODEL_DIR ENGINE_URL {good|bad-shape|twice|plain|small-chunks|die}

Pushes are packed (TRL's `packed: true` in init_info) unless the mode says otherwise. `twice` pushes
versions 1 and 2 through one transfer group; `plain` sends one tensor per broadcast; `small-chunks`
packs into 64 KiB buffers, so the model travels as many chunks cut the way vLLM cuts them. `die` pauses
the engine, starts an update, broadcasts half the tensors and exits hard: a trainer crashing mid-update.
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


def die_mid_update(url: str, named: list[tuple[str, torch.Tensor]]) -> None:
    sync = WeightSyncClient(url, backend="gloo", timeout_s=60, packed=False)
    sync.init_transfer()
    sync._call("POST", "/pause", params={"mode": "keep"})
    sync._call("POST", "/start_weight_update", json={"is_checkpoint_format": True})
    info = {
        "names": [n for n, _ in named],
        "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named],
        "shapes": [list(t.shape) for _, t in named],
    }
    sync._in_background("/update_weights", {"update_info": info})
    sync.transport.send([(n, t.detach().contiguous()) for n, t in named[: len(named) // 2]], info)
    print(json.dumps({"died_after": len(named) // 2}), flush=True)
    os._exit(0)


def main() -> None:
    model_dir, url, mode = sys.argv[1:4]
    torch.set_num_threads(1)
    model = perturbed(model_dir)
    named = list(model.named_parameters())
    if mode == "bad-shape":  # a trainer bug: one tensor has the wrong shape
        name, param = named[3]
        named[3] = (name, torch.zeros(param.shape[0] + 1, *param.shape[1:]))
    if mode == "die":
        die_mid_update(url, named)
    options = {"plain": {"packed": False}, "small-chunks": {"packed_buffer_size_bytes": 64 * 1024}}
    with WeightSyncClient(url, backend="gloo", timeout_s=60, **options.get(mode, {})) as sync:
        try:
            versions = [sync.push(named, version=1)]
            if mode == "twice":
                versions.append(sync.push(perturbed(model_dir, step=2).named_parameters(), version=2))
        except WeightSyncError as exc:
            print(json.dumps({"error": str(exc)}))
            return
    print(json.dumps({"versions": versions}))


if __name__ == "__main__":
    main()
