"""What a weight push sends: the parameters vLLM loads, under the names it loads them by, one full tensor
at a time (docs/design.md 3.9, "Parameters sent").

    stream = pushed_weights(model)          # a WeightStream: metadata first, tensors when iterated
    with peft_merged(model):
        client.push(stream, version)        # rank 0; under FSDP2 every other rank drains the stream

The rules are TRL 1.16's (`_iter_vllm_named_params` in `trl/experimental/async_grpo/async_grpo_trainer.py`):
- frozen parameters are not sent (vLLM loaded them from the same checkpoint and they never change),
  except under PEFT, where it is the other way round: the adapter tensors are trainable but vLLM never
  sees them, and the frozen base weights, with the adapter merged in for the push, are what changes;
- wrapper prefixes are dropped: DDP/FSDP1's `module.` and `_fsdp_wrapped_module.`, activation
  checkpointing's `_checkpoint_wrapped_module.`, torch.compile's `_orig_mod.`, PEFT's
  `base_model.model.` and `.base_layer`, and `modules_to_save.default.` (the `original_module` copy is
  dropped);
- under FSDP2 each parameter is a DTensor whose `shape` is the full one, so the metadata costs no
  gather; iterating calls `full_tensor()` on one parameter at a time (a collective every rank joins),
  never the whole model at once.

One rule is ours: a frozen parameter is sent anyway when a trainable one sits in a leaf module of the
same type beside its own (`self_attn.k_proj.weight` when `self_attn.q_proj.weight` trains). vLLM
fuses such siblings into one parameter (q/k/v into `qkv_proj`, gate/up into `gate_up_proj`), and its
layerwise reload gives any part of a layer that was not sent uninitialised memory:
`materialize_meta_tensor` allocates with `torch.empty_strided` and the layer is then copied whole into
the served weights (`vllm/model_executor/model_loader/reload/meta.py`, `layerwise.py`, "Delayed
processing"). A layer frozen whole is simply not loaded and keeps its weights ("Failed to load
weights" fallback).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
WRAPPER_INFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def is_peft(model: Any) -> bool:
    """A PEFT model (checked by its API, so peft need not be installed)."""
    return hasattr(model, "peft_config") and callable(getattr(model, "merge_adapter", None))


def vllm_name(name: str) -> str:
    """A parameter's name as the base checkpoint (and vLLM) has it."""
    for prefix in WRAPPER_PREFIXES:
        name = name.removeprefix(prefix)
    for infix in WRAPPER_INFIXES:
        name = name.replace(infix, "")
    return (
        name.removeprefix("base_model.model.")
        .replace(".base_layer", "")
        .replace("modules_to_save.default.", "")
    )


def _fusion_units(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """Each parameter's unit of fusion: a leaf module's parameters share one with the leaf modules of
    the same type beside it (q/k/v/o_proj under self_attn; gate/up/down_proj under mlp), which is
    where vLLM fuses; a parameter held by a module with children of its own is a unit alone."""
    units: dict[str, tuple[str, ...]] = {}
    for owner_name, owner in model.named_modules():
        leaf = next(owner.children(), None) is None
        for param_name, _ in owner.named_parameters(recurse=False):
            name = f"{owner_name}.{param_name}" if owner_name else param_name
            units[name] = (
                (owner_name.rpartition(".")[0], type(owner).__name__, param_name) if leaf else (name,)
            )
    return units


def pushed_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(vLLM name, parameter) of every parameter a push sends, in `named_parameters()` order."""
    named = list(model.named_parameters())
    if is_peft(model):
        adapter = getattr(model, "prefix", "lora_")
        return [
            (vllm_name(name), p) for name, p in named if adapter not in name and "original_module" not in name
        ]
    units = _fusion_units(model)
    unit = lambda name: units.get(name, (name,))  # noqa: E731
    trainable = {unit(name) for name, p in named if p.requires_grad}
    kept = [(name, p) for name, p in named if p.requires_grad or unit(name) in trainable]
    return [(vllm_name(name), p) for name, p in kept if "original_module" not in name]


class ParameterStream:
    """A WeightStream (engine.weight_client) over parameters: metadata from their (global) shapes,
    iteration one full tensor at a time (`full_tensor()` for an FSDP2 DTensor)."""

    def __init__(self, parameters: list[tuple[str, torch.nn.Parameter]]) -> None:
        self.parameters = parameters
        self.started = False
        """Whether an iteration began (a push that failed before sending must still join the gathers)."""

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(name, p.dtype, tuple(p.shape)) for name, p in self.parameters]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self.started = True  # set at iter(), not at the first next(): the push's feeder calls iter() at once
        return self._gathered()

    def _gathered(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.parameters:
            full = getattr(param, "full_tensor", None)
            with torch.no_grad():
                yield name, (full() if callable(full) else param.detach())

    def drain(self) -> None:
        """Join every gather without sending anything (ranks other than 0 under FSDP2)."""
        for _ in self:
            pass


def pushed_weights(model: torch.nn.Module) -> ParameterStream:
    return ParameterStream(pushed_parameters(model))


def push_from_every_rank(model: torch.nn.Module, processes: Any, push: Callable[[ParameterStream], T]) -> T:
    """Run `push(stream)` on rank 0 and hand every rank its result or its error (`processes.on_main`).
    Under FSDP2 the other ranks iterate the same stream meanwhile, joining each gather; if rank 0's push
    fails before its iteration began, rank 0 still iterates it, so no rank is left waiting in a gather."""
    stream = pushed_weights(model)
    gathers = processes.gathers_weights

    def on_rank_0() -> T:
        try:
            return push(stream)
        except BaseException:
            if gathers and not stream.started:
                stream.drain()
            raise

    with peft_merged(model):
        if gathers and not processes.is_main:
            stream.drain()
        return processes.on_main(on_rank_0)


@contextlib.contextmanager
def peft_merged(model: Any) -> Iterator[None]:
    """Merge a PEFT adapter into the base weights for the push, and take it out again after, also on
    failure (left merged, the next steps would train merged weights). No-op for other models."""
    if not is_peft(model):
        yield
        return
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()
