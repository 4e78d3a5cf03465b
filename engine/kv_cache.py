"""The running batch's key/value cache, in transformers' cache objects.

A decode step appends one token's keys and values to every layer. transformers' `DynamicLayer` does that
with `torch.cat`, a new tensor holding the whole batch's cache, and building a `DynamicCache` from
tensors concatenates them once more; at 16 sequences of ~250 tokens those copies were a third of a
decode step (cProfile: 0.19 of 0.6 s). `GrowingLayer` keeps spare room after the cached tokens instead
and writes each step's keys into it: a copy only when the room runs out or when the batch changes
shape (a sequence joins or leaves).
"""

from __future__ import annotations

import inspect
from itertools import repeat

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values of shape [batch, kv heads, tokens, head dim]."""
Room = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, the buffers `KV` views into, with space for more tokens."""
GROWTH_TOKENS = 64
"""Room made at least when a layer runs out (an eighth of its length when that is more): a typical
completion then fits without another copy."""


def _layer_base():
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # transformers 4.x before cache layers: no GrowingLayer
        return None
    return DynamicLayer


_DynamicLayer = _layer_base()
_CACHE_TAKES_LAYERS = _DynamicLayer is not None and "layers" in inspect.signature(
    __import__("transformers").Cache.__init__
).parameters


def _with_room(tensor: torch.Tensor, size: int) -> torch.Tensor:
    buffer = tensor.new_empty((*tensor.shape[:-2], size, tensor.shape[-1]))
    buffer[..., : tensor.shape[-2], :] = tensor
    return buffer


if _DynamicLayer is not None:

    class GrowingLayer(_DynamicLayer):
        """A `DynamicLayer` over given keys and values that appends in place into spare room."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: tuple[torch.Tensor, torch.Tensor] | None):
            super().__init__()
            self.keys, self.values = keys, values
            self.room = room if room is not None else (keys, values)
            """The buffers `keys` and `values` are the first tokens of."""
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            length = self.keys.shape[-2]
            end = length + key_states.shape[-2]
            keys_room, values_room = self.room
            if keys_room.shape[-2] < end:
                size = end + max(GROWTH_TOKENS, length // 8)
                keys_room, values_room = _with_room(self.keys, size), _with_room(self.values, size)
                self.room = (keys_room, values_room)
            keys_room[..., length:end, :] = key_states
            values_room[..., length:end, :] = value_states
            self.keys, self.values = keys_room[..., :end, :], values_room[..., :end, :]
            return self.keys, self.values


def make_cache(kv: KV | None):
    """A transformers `DynamicCache` holding `kv` (empty for None): what a prefill extends."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()


def growing_cache(kv: KV, room: Room | None):
    """A cache holding `kv` whose updates append in place: into `room` (the buffers an earlier
    `cache_tensors` returned for these very tensors), else into room made at the first update."""
    if not _CACHE_TAKES_LAYERS:
        return make_cache(kv)
    from transformers import Cache

    return Cache(layers=[GrowingLayer(k, v, r) for (k, v), r in zip(kv, room or repeat(None), strict=False)])


def cache_tensors(cache) -> tuple[KV, Room | None]:
    """The cache's keys and values per layer, and the buffers they view (None: no spare room)."""
    if not hasattr(cache, "layers"):
        return list(zip(cache.key_cache, cache.value_cache, strict=True)), None  # transformers 4.x
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    rooms = [getattr(layer, "room", None) for layer in cache.layers]
    return kv, (rooms if all(r is not None for r in rooms) else None)
