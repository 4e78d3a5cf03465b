"""Training rows from a validated trace (docs/design.md 3.2): the one record the trainer consumes.

A row is one root-to-leaf chain of the rollout graph. Its calls extend each other exactly, so the row is
the leaf's prompt + completion, no re-tokenisation: each call's sampled tokens sit at the positions it
produced them, and what lies between (tool outputs, the next user message) is context with mask 0.
Where the tree branches, a call's completion is trained in exactly one row (its first agent branch);
the others see it as context. Rows that train nothing are dropped. Cost is linear in the output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from capture_proxy.graph import RolloutGraph
from capture_proxy.models import TrainingTrace, TrainingTurn
from capture_proxy.validation import require_trainable_graph

__all__ = ["TrainingRow", "build_training_rows"]


@dataclass(frozen=True)
class TrainingRow:
    """One packed training sequence. The per-position tuples all have len(input_ids) entries."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """1 where the policy is trained: sampled tokens of the row's agent calls whose own mask said 1."""
    behavior_logps: tuple[float, ...]
    """The engine's sampled logprob at trained positions, 0.0 elsewhere."""
    node_ids: tuple[str, ...]
    """The calls merged into this row, root first."""
    policy_versions: tuple[int | None, ...]
    """The policy version each of `node_ids` was sampled with."""
    session_id: str | None
    trained_node_ids: tuple[str, ...] = ()
    """The subset of `node_ids` whose tokens this row trains (each call is trained in one row only)."""

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


def build_training_rows(trace: TrainingTrace | Mapping[str, Any]) -> list[TrainingRow]:
    """The training rows of a trace; raises InvalidTraceError when the trace has FATAL findings."""
    trace, graph = require_trainable_graph(trace)
    turns = trace.turns
    trained_by_leaf: dict[str, list[str]] = {}
    for node_id, leaf in _owning_leaves(graph, turns).items():
        trained_by_leaf.setdefault(leaf, []).append(node_id)
    # Leaves in call order; a leaf is listed once all of its row's trained calls are known.
    return [
        _row(trace.session_id, graph, turns, leaf, trained_by_leaf[leaf])
        for leaf in graph.nodes
        if leaf in trained_by_leaf
    ]


def _owning_leaves(graph: RolloutGraph, turns: list[TrainingTurn]) -> dict[str, str]:
    """For each trainable agent call, the leaf of the one row that trains it.

    Rows follow token links only: a child linked by messages (a call whose ids were never captured,
    such as a recorded transport failure) has no tokens to extend the row with. A node's row is its
    first agent child's row (first by call order), so the continued branch, not a discarded retry or a
    side call, carries what came before it. Children always come after their parent in the trace, so
    one pass in reverse order settles every node.
    """
    primary_leaf: dict[str, str] = {}
    for node in reversed(graph.nodes.values()):
        children = [c for c in node.children if graph.nodes[c].link == "tokens"]
        if not children:
            primary_leaf[node.node_id] = node.node_id
            continue
        agents = [c for c in children if graph.nodes[c].role == "agent"]
        primary_leaf[node.node_id] = primary_leaf[(agents or children)[0]]
    return {
        node.node_id: primary_leaf[node.node_id]
        for node in graph.nodes.values()
        if node.role == "agent" and turns[node.index].trainable
    }


def _row(
    session_id: str | None, graph: RolloutGraph, turns: list[TrainingTurn], leaf: str, trained: list[str]
) -> TrainingRow:
    last = turns[graph.nodes[leaf].index]
    input_ids = last.prompt_token_ids + last.completion_token_ids
    mask = np.zeros(len(input_ids), dtype=np.int8)
    logps = np.zeros(len(input_ids), dtype=np.float64)
    for node_id in trained:
        turn = turns[graph.nodes[node_id].index]
        start, end = len(turn.prompt_token_ids), len(turn.prompt_token_ids) + len(turn.completion_token_ids)
        # A descendant's prompt starts with this call's prompt + completion (the graph checked it
        # token by token), so the call's sampled tokens sit at the same positions in the leaf's.
        node_mask = np.asarray(turn.loss_mask[start:end], dtype=np.int8)
        mask[start:end] = node_mask
        logps[start:end] = np.where(node_mask == 1, np.asarray(turn.per_token_logps, dtype=np.float64), 0.0)
    chain = graph.chain(leaf)
    trained_set = set(trained)
    return TrainingRow(
        input_ids=tuple(input_ids),
        loss_mask=tuple(mask.tolist()),
        behavior_logps=tuple(logps.tolist()),
        node_ids=tuple(chain),
        policy_versions=tuple(turns[graph.nodes[n].index].metadata.policy_version for n in chain),
        session_id=session_id,
        trained_node_ids=tuple(n for n in chain if n in trained_set),
    )
