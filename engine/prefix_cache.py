"""Automatic prefix caching, as vLLM does it by default (`enable_prefix_caching`, vllm/v1/core/
kv_cache_manager.py): a prompt that begins with blocks of tokens an earlier prompt had reuses their
key/value tensors, and only the rest is prefilled.

Agent rollouts make this the engine's largest saving: every rollout of a task opens with the same
harness system prompt and instruction (~1,300 tiny-tokenizer tokens for mini-swe-agent), and each later
call resends the whole conversation. As in vLLM, blocks are found by a chain of hashes (a block's key
covers every token before it), the last prompt token is always computed (its logits sample the first
new token), and the cache is emptied when the weights change (vLLM's RLHF loop calls
`reset_prefix_cache` after each update; here the scheduler does it as it applies them).

Unlike vLLM's paged blocks, each entry keeps the whole prompt's tensors of one prefill; entries are
dropped least recently used first once they hold more than `max_bytes`.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
"""Tokens per block, vLLM's default `block_size` on GPU."""

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values of shape [1, heads, tokens, head_dim]."""


@dataclass(eq=False)
class _Entry:
    tokens: list[int]
    kv: KV
    keys: list[int]
    nbytes: int


def block_keys(tokens: list[int], block_size: int = BLOCK_SIZE) -> list[int]:
    """One key per whole block of `tokens`, each hashing the previous key and the block's tokens."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start : start + block_size]))
        keys.append(parent)
    return keys


class PrefixCache:
    """Key/value tensors of earlier prompts, found by their leading blocks."""

    def __init__(self, max_bytes: int, block_size: int = BLOCK_SIZE):
        self.max_bytes = max_bytes
        self.block_size = block_size
        self._entries: collections.OrderedDict[_Entry, None] = collections.OrderedDict()
        """Entries, least recently used first."""
        self._by_key: dict[int, tuple[_Entry, int]] = {}
        """Block key -> the entry that holds that block most recently, and the tokens up to its end."""
        self._bytes = 0
        self.queries = 0
        """Prompt tokens looked up (vLLM's `prefix_cache_queries`)."""
        self.hits = 0
        """Prompt tokens found (vLLM's `prefix_cache_hits`)."""

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: list[int]) -> tuple[int, KV | None]:
        """How many leading tokens of `tokens` are cached (never all: the last one is prefilled), and
        their key/value tensors (views; nothing writes to them)."""
        self.queries += len(tokens)
        found: tuple[_Entry, int] | None = None
        for key in block_keys(tokens[: len(tokens) - 1], self.block_size):
            match = self._by_key.get(key)
            if match is None:
                break
            found = match
        if found is None:
            return 0, None
        entry, length = found
        if entry.tokens[:length] != tokens[:length]:  # a hash collision: never serve another prompt's keys
            return 0, None
        self._entries.move_to_end(entry)
        self.hits += length
        return length, [(k[:, :, :length], v[:, :, :length]) for k, v in entry.kv]

    def store(self, tokens: list[int], kv: KV, cached: int) -> None:
        """Keep the tensors of a prefilled prompt whose first `cached` tokens came from the cache,
        when it adds at least one whole block."""
        keys = block_keys(tokens, self.block_size)
        if len(keys) * self.block_size <= cached:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        entry = _Entry(tokens=list(tokens), kv=kv, keys=keys, nbytes=nbytes)
        self._entries[entry] = None
        self._bytes += nbytes
        for index, key in enumerate(keys):
            self._by_key[key] = (entry, (index + 1) * self.block_size)
        while self._bytes > self.max_bytes:
            self._evict(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._by_key.clear()
        self._bytes = 0

    def _evict(self, entry: _Entry) -> None:
        del self._entries[entry]
        self._bytes -= entry.nbytes
        for key in entry.keys:
            match = self._by_key.get(key)
            if match is not None and match[0] is entry:
                del self._by_key[key]
