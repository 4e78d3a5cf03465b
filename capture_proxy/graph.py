"""The rollout graph (docs/design.md 3.2): which captured call continues which, and which calls can be trained.

Each call is a node. A call links to the existing node whose prompt + completion ids are the longest
exact token prefix of its prompt; a call with no token ids falls back to message lists. A call that
extends nothing (rewritten or compacted history) opens a new root. Roles: `discarded` for retries (a
sibling with the same prompt where another sibling was continued), `auxiliary` for tool-less side calls
while other calls use tools, `agent` for the rest; only agent turns are trained on.

Linking costs time linear in the trace's tokens, not quadratic in its turns: the previous call is tried
first (it is the parent in the common case), one byte compare of its sequence; on a miss the first
differing position says how far up its ancestry to climb; from there the walk goes down comparing only
each child's new tokens. The longest match can lie off that path only below a branch point whose
children's sequences are prefixes of one another (a retry that sampled the same tokens); those few
branch points are remembered and their other children walked as well.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from capture_proxy.errors import InvalidTraceError
from capture_proxy.findings import Finding, Severity
from capture_proxy.models import TrainingTrace, TrainingTurn, TurnRole

__all__ = ["RolloutGraph", "RolloutNode", "build_rollout_graph", "finalize_trace"]

Link = Literal["tokens", "messages"]


@dataclass
class RolloutNode:
    node_id: str
    index: int
    """Position of the turn in the trace."""
    parent: str | None
    children: list[str] = field(default_factory=list)
    root: str = ""
    role: TurnRole = "agent"
    link: Link | None = None
    """How the parent was found: exact token prefix, message-list prefix, or None for a root."""


@dataclass
class RolloutGraph:
    nodes: dict[str, RolloutNode]
    """Every node, in turn order."""
    roots: list[str]
    comparisons: int = 0
    """Sequence comparisons made while linking (each one a single C-level compare); linear in turns."""

    def chain(self, node_id: str) -> list[str]:
        """Node ids from the root down to `node_id`."""
        out = []
        current: str | None = node_id
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent
        return out[::-1]

    def leaves(self) -> list[str]:
        return [n.node_id for n in self.nodes.values() if not n.children]


def build_rollout_graph(turns: Sequence[TrainingTurn]) -> RolloutGraph:
    """Link the turns of one rollout into a forest and assign each node its role."""
    seen: dict[str, int] = {}
    for i, turn in enumerate(turns):
        if turn.node_id in seen:
            finding = Finding(
                severity=Severity.FATAL,
                code="duplicate_node_id",
                message=f"node_id {turn.node_id!r} is already used by turns[{seen[turn.node_id]}]",
                location=f"turns[{i}].node_id",
            )
            raise InvalidTraceError([finding])
        seen[turn.node_id] = i

    linker = _Linker(turns)
    nodes: dict[str, RolloutNode] = {}
    roots: list[str] = []
    for i, turn in enumerate(turns):
        parent, link = linker.link(i)
        node = RolloutNode(turn.node_id, i, None if parent is None else turns[parent].node_id, link=link)
        if node.parent is None:
            node.root = node.node_id
            roots.append(node.node_id)
        else:
            parent_node = nodes[node.parent]
            parent_node.children.append(node.node_id)
            node.root = parent_node.root
        nodes[node.node_id] = node
    graph = RolloutGraph(nodes, roots, comparisons=linker.comparisons)
    _assign_roles(graph, turns, linker)
    return graph


def finalize_trace(trace: TrainingTrace) -> TrainingTrace:
    """A new trace whose turns carry their parent and role, with the masks of non-agent turns zeroed."""
    graph = build_rollout_graph(trace.turns)
    turns = []
    for turn in trace.turns:
        node = graph.nodes[turn.node_id]
        metadata = turn.metadata.model_copy(update={"parent_node_id": node.parent, "role": node.role})
        update: dict[str, Any] = {"metadata": metadata}
        if node.role != "agent":
            update["loss_mask"] = [0] * len(turn.loss_mask)
        turns.append(turn.model_copy(update=update))
    return trace.model_copy(update={"turns": turns})


# ---------------------------------------------------------------------------------------------------
# Linking


class _Linker:
    """Finds each new turn's parent among the turns before it (see the module docstring for the cost)."""

    def __init__(self, turns: Sequence[TrainingTurn]):
        self.turns = turns
        self.comparisons = 0
        # Per turn (prompt None where the turn has no prompt ids): prompt and completion as int64 bytes.
        self.prompt: list[bytes | None] = []
        self.completion: list[bytes] = []
        self.parent: list[int | None] = []
        self.suffix: list[bytes] = []
        """A token node's sequence beyond its parent's: all the walk down compares."""
        self.depth: list[int] = []
        self.jumps: list[list[int]] = []
        """jumps[i][k]: the 2**k-th ancestor of token node i (binary lifting, for ancestry tests)."""
        self.token_children: dict[int | None, list[int]] = {}
        """Children linked by tokens, per parent turn; key None holds the token roots."""
        self.ambiguous: set[int | None] = set()
        """Parents (None: the roots) with two children whose sequences are prefixes of one another, the
        only places where the longest match can lie off the path of the previous call."""
        self.last_token_node: int | None = None
        self._messages: _MessageIndex | None = None

    def link(self, i: int) -> tuple[int | None, Link | None]:
        turn = self.turns[i]
        try:
            prompt = _as_bytes(turn.prompt_token_ids) if turn.prompt_token_ids else None
            completion = _as_bytes(turn.completion_token_ids)
        except OverflowError:
            message = "a token id does not fit in int64"
            where = f"turns[{i}]"
            raise InvalidTraceError(
                [Finding(severity=Severity.FATAL, code="invalid_token_id", message=message, location=where)]
            ) from None
        self.prompt.append(prompt)
        self.completion.append(completion)
        if prompt is None:
            parent = self._message_index().parent_of(i)
            self._register(i, parent, b"")
            self._message_index().add(i)
            return parent, None if parent is None else "messages"
        parent = self._token_parent(prompt)
        offset = self._seq_len(parent)
        self._register(i, parent, (prompt + self.completion[i])[offset:])
        siblings = self.token_children.setdefault(parent, [])
        if parent not in self.ambiguous and any(self._prefix_related(i, s) for s in siblings):
            self.ambiguous.add(parent)
        siblings.append(i)
        self.last_token_node = i
        if self._messages is not None:
            self._messages.add(i)
        return parent, None if parent is None else "tokens"

    def _register(self, i: int, parent: int | None, suffix: bytes) -> None:
        self.parent.append(parent)
        self.suffix.append(suffix)
        self.depth.append(0 if parent is None else self.depth[parent] + 1)
        jumps: list[int] = []
        if parent is not None:
            jumps.append(parent)
            while len(self.jumps[jumps[-1]]) >= len(jumps):
                jumps.append(self.jumps[jumps[-1]][len(jumps) - 1])
        self.jumps.append(jumps)

    def _token_parent(self, prompt: bytes) -> int | None:
        if self.last_token_node is None:
            return None
        on_path = self._deepest_matching_ancestor(self.last_token_node, prompt)
        best = self._walk_down(on_path, prompt)
        if on_path is None:
            return best  # the walk started from the roots: nothing is off its path
        # Off the path, a longer match can only hang below an ambiguous branch point above it.
        for branch in self.ambiguous:
            if branch is not None and not self._is_ancestor(branch, on_path):
                continue
            for child in self.token_children.get(branch, ()):
                if not self._is_ancestor(child, on_path) and self._matches(child, prompt):
                    best = self._longer(best, self._walk_down(child, prompt))
        return best

    def _deepest_matching_ancestor(self, node: int, prompt: bytes) -> int | None:
        """The deepest of `node` and its ancestors whose sequence is a prefix of `prompt`."""
        self.comparisons += 1
        matched = _common_prefix_bytes(prompt, self.prompt[node] or b"", self.completion[node])
        current: int | None = node
        # Sequences along a token path are nested prefixes, so every ancestor no longer than the
        # matched span matches too: climb by lengths, with no more compares.
        while current is not None and self._seq_len(current) > matched:
            current = self.parent[current]
        return current

    def _walk_down(self, start: int | None, prompt: bytes) -> int | None:
        """The longest node at or below `start` (None: from the roots) whose sequence prefixes `prompt`."""
        best = start
        stack = [start]
        while stack:
            node = stack.pop()
            for child in self.token_children.get(node, ()):
                if self._matches(child, prompt):
                    best = self._longer(best, child)
                    stack.append(child)
        return best

    def _matches(self, child: int, prompt: bytes) -> bool:
        """Whether `child`'s sequence prefixes `prompt`, given that its parent's does."""
        self.comparisons += 1
        offset, suffix = self._seq_len(self.parent[child]), self.suffix[child]
        return len(prompt) >= offset + len(suffix) and prompt.startswith(suffix, offset)

    def _longer(self, a: int | None, b: int | None) -> int | None:
        """The longer match; on a tie the later call (the one the agent saw last)."""
        la, lb = self._seq_len(a), self._seq_len(b)
        if a is None or lb > la or (lb == la and b is not None and b > a):
            return b
        return a

    def _is_ancestor(self, a: int, node: int) -> bool:
        """Whether `a` is `node` or one of its ancestors (O(log depth))."""
        climb = self.depth[node] - self.depth[a]
        if climb < 0:
            return False
        k = 0
        while climb:
            if climb & 1:
                node = self.jumps[node][k]
            climb >>= 1
            k += 1
        return node == a

    def _prefix_related(self, a: int, b: int) -> bool:
        self.comparisons += 1
        sa, sb = self.suffix[a], self.suffix[b]
        return sa.startswith(sb) or sb.startswith(sa)

    def _seq_len(self, node: int | None) -> int:
        if node is None:
            return 0
        return len(self.prompt[node] or b"") + len(self.completion[node])

    def _message_index(self) -> _MessageIndex:
        if self._messages is None:
            self._messages = _MessageIndex(self.turns)
            for j in range(len(self.prompt) - 1):
                self._messages.add(j)
        return self._messages


class _MessageIndex:
    """Message-list prefixes, for turns without token ids: each node is keyed by a digest chained over
    its request messages plus its response message, so finding the longest prefix of a new message list
    is one dictionary lookup per message."""

    def __init__(self, turns: Sequence[TrainingTurn]):
        self.turns = turns
        self.by_key: dict[bytes, int] = {}

    def add(self, i: int) -> None:
        turn = self.turns[i]
        messages = _request_messages(turn)
        reply = _response_message(turn)
        if messages is None or reply is None:
            return
        keys = _chain_keys([*messages, reply])
        self.by_key[keys[-1]] = i  # a later identical call wins ties

    def parent_of(self, i: int) -> int | None:
        messages = _request_messages(self.turns[i])
        if not messages:
            return None
        for key in reversed(_chain_keys(messages)):
            if key in self.by_key:
                return self.by_key[key]
        return None


def _chain_keys(messages: Sequence[Any]) -> list[bytes]:
    keys, previous = [], b""
    for message in messages:
        previous = hashlib.blake2b(previous + _message_bytes(message), digest_size=16).digest()
        keys.append(previous)
    return keys


def _message_bytes(message: Any) -> bytes:
    """A canonical form of a chat message: what the agent replays of a reply may differ in null fields,
    extra response-only keys and content-part framing, none of which changes the conversation."""
    if not isinstance(message, Mapping):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS, default=str)
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {} if isinstance(call, Mapping) else {}
        calls.append(
            [
                call.get("id") if isinstance(call, Mapping) else None,
                function.get("name"),
                function.get("arguments"),
            ]
        )
    canonical = [message.get("role"), content or "", calls, message.get("tool_call_id"), message.get("name")]
    return orjson.dumps(canonical, default=str)


def _request_messages(turn: TrainingTurn) -> list[Any] | None:
    messages = turn.request.get("messages")
    return messages if isinstance(messages, list) else None


def _response_message(turn: TrainingTurn) -> Any | None:
    choices = turn.response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0].get("message")
    return None


def _as_bytes(ids: list[int]) -> bytes:
    return np.asarray(ids, dtype=np.int64).tobytes()


def _common_prefix_bytes(prompt: bytes, *parts: bytes) -> int:
    """Length (in bytes, whole tokens) of the common prefix of `prompt` and the concatenated `parts`."""
    matched = 0
    for part in parts:
        n = min(len(part), len(prompt) - matched)
        if n == len(part) and prompt.startswith(part, matched):
            matched += n
            continue
        a = np.frombuffer(prompt, dtype=np.int64, count=n // 8, offset=matched)
        b = np.frombuffer(part, dtype=np.int64, count=n // 8)
        differ = np.flatnonzero(a != b)
        return matched + (int(differ[0]) * 8 if differ.size else n)
    return matched


# ---------------------------------------------------------------------------------------------------
# Roles


def _assign_roles(graph: RolloutGraph, turns: Sequence[TrainingTurn], linker: _Linker) -> None:
    uses_tools = any(turn.request.get("tools") for turn in turns)
    if uses_tools:
        for node in graph.nodes.values():
            if not turns[node.index].request.get("tools"):
                node.role = "auxiliary"
    # Retries: siblings (roots count as siblings) with the same prompt where one was continued.
    sibling_groups: list[list[str]] = [graph.roots, *(n.children for n in graph.nodes.values())]
    for siblings in sibling_groups:
        if len(siblings) < 2:
            continue
        by_prompt: dict[bytes, list[RolloutNode]] = {}
        for node_id in siblings:
            node = graph.nodes[node_id]
            by_prompt.setdefault(_prompt_key(turns[node.index], linker.prompt[node.index]), []).append(node)
        for group in by_prompt.values():
            if len(group) > 1 and any(n.children for n in group):
                for n in group:
                    if not n.children and n.role == "agent":
                        n.role = "discarded"


def _prompt_key(turn: TrainingTurn, prompt: bytes | None) -> bytes:
    if prompt is not None:
        return b"t" + prompt
    messages = _request_messages(turn)
    return b"m" + (_chain_keys(messages)[-1] if messages else b"")
