"""Prefix sharing between the turns of one session.

An agent's prompt at turn k is usually its prompt at turn k-1 plus that turn's completion plus the
tool output: storing every prompt in full costs O(turns x context), quadratic in the session length.
So a turn's prompt is stored as (base seq, shared length, suffix): the first `shared` tokens of the
base turn's prompt + completion, then the suffix. The base is an earlier turn of the same session
(a foreign key keeps it there), so a session's turns read in seq order rebuild every prompt exactly.

The same base turn serves the request's messages (compact.py): the turn stores only the messages
after those it shares with the base turn's.

The writer remembers the last turn it committed per session (its tokens as int32 bytes and its
messages as one JSON array, with a memory budget).
A session it does not remember (another process wrote it, or it was evicted) simply gets a full
prompt, which later turns then share from.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from capture_proxy.store.compact import NO_MESSAGES, Messages

_ID_BYTES = 4


@dataclass(frozen=True, slots=True)
class Base:
    seq: int
    tokens: bytes
    """The base turn's prompt + completion ids, int32 little-endian."""
    messages: Messages = NO_MESSAGES
    """The base turn's request messages (compact.messages_of)."""
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", len(self.tokens) + len(self.messages.text))


@dataclass(frozen=True, slots=True)
class PromptDelta:
    base_seq: int | None
    shared: int
    """How many leading tokens come from the base turn (0 when base_seq is None)."""
    suffix: bytes


def shared_prefix(a: bytes, b: bytes) -> int:
    """Number of leading int32 tokens two encoded arrays have in common."""
    # The usual turn: one array extends the other (a memcmp, no arrays built).
    if a.startswith(b) or b.startswith(a):
        return min(len(a), len(b)) // _ID_BYTES
    n = min(len(a), len(b)) // _ID_BYTES
    x = np.frombuffer(a, dtype="<i4", count=n)
    y = np.frombuffer(b, dtype="<i4", count=n)
    differ = np.flatnonzero(x != y)
    return int(differ[0]) if differ.size else n


def delta(prompt: bytes, seq: int, base: Base | None) -> PromptDelta:
    """The prompt expressed against `base` when that saves anything, else in full."""
    if base is None or base.seq >= seq:  # a base must come earlier, so reading in seq order works
        return PromptDelta(None, 0, prompt)
    shared = shared_prefix(prompt, base.tokens)
    if shared == 0:
        return PromptDelta(None, 0, prompt)
    return PromptDelta(base.seq, shared, prompt[shared * _ID_BYTES :])


def rebuild(suffix: bytes, base_tokens: bytes | None, shared: int) -> bytes:
    if base_tokens is None:
        return suffix
    return base_tokens[: shared * _ID_BYTES] + suffix


class BaseCache:
    """The last committed turn of recently written sessions, least recently used evicted first."""

    def __init__(self, max_bytes: int):
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, Base] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Base | None:
        with self._lock:
            base = self._entries.get(session_id)
            if base is not None:
                self._entries.move_to_end(session_id)
            return base

    def put(self, session_id: str, base: Base) -> None:
        """Remember `base` unless a later turn of the session is remembered already."""
        if base.nbytes > self._max_bytes:
            self.drop(session_id)
            return
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None and old.seq > base.seq:
                base = old
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[session_id] = base
            self._bytes += base.nbytes
            while self._bytes > self._max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def drop(self, session_id: str) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._bytes -= old.nbytes
