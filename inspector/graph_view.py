"""The rollout graph (docs/design.md 3.2) drawn as inline SVG.

Columns are calls in the order they were made; each root starts a lane and a branch (a retry, a
rewritten history) opens a new lane below, so a plain agent loop is one straight chain. Marks:
agent turns are filled blue circles, roots have a thick ring, discarded turns are grey dashed circles
with a cross, auxiliary turns are orange squares. Every node has a <title> tooltip and `data-*`
attributes (node id, role, root) for tests and scripts.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from capture_proxy.graph import RolloutGraph
from capture_proxy.models import TrainingTurn

COLUMN_PX = 34
LANE_PX = 34
MARGIN_PX = 22
RADIUS_PX = 9

_LEGEND = (
    '<div class="legend graph-legend">'
    '<svg width="600" height="22" role="img" aria-label="graph legend">'
    '<circle cx="11" cy="11" r="7" fill="#2563eb" stroke="#1e3a8a" stroke-width="3"/>'
    '<text x="22" y="15" font-size="12">root</text>'
    '<circle cx="70" cy="11" r="7" fill="#2563eb"/><text x="81" y="15" font-size="12">agent (trained)</text>'
    '<circle cx="190" cy="11" r="7" fill="#e5e7eb" stroke="#6b7280" stroke-dasharray="3 2"/>'
    '<path d="M185 6 L195 16 M195 6 L185 16" stroke="#6b7280"/>'
    '<text x="201" y="15" font-size="12">discarded (retry)</text>'
    '<rect x="318" y="4" width="14" height="14" fill="#fb923c"/>'
    '<text x="338" y="15" font-size="12">auxiliary (side call)</text>'
    '<line x1="470" y1="11" x2="500" y2="11" stroke="#9ca3af" stroke-dasharray="4 3"/>'
    '<text x="505" y="15" font-size="12">by messages</text>'
    "</svg></div>"
)


def _lanes(graph: RolloutGraph) -> dict[str, int]:
    """Lane per node: the main child (an agent turn with the biggest subtree) stays in its parent's
    lane, so the chain that was continued reads straight; other children (retries) open new lanes."""
    size = dict.fromkeys(graph.nodes, 1)
    for node in reversed(graph.nodes.values()):  # children come after their parent in call order
        if node.parent is not None:
            size[node.parent] += size[node.node_id]

    def main_first(children: list[str]) -> list[str]:
        return sorted(
            children, key=lambda c: (graph.nodes[c].role != "agent", -size[c], graph.nodes[c].index)
        )

    lanes: dict[str, int] = {}
    next_lane = 0
    for root in graph.roots:
        stack = [(root, next_lane)]
        next_lane += 1
        while stack:
            node_id, lane = stack.pop()
            lanes[node_id] = lane
            children = main_first(graph.nodes[node_id].children)
            # Side children get fresh lanes; pushed first, so the main child is laid out next.
            for child in reversed(children[1:]):
                stack.append((child, next_lane))
                next_lane += 1
            if children:
                stack.append((children[0], lane))
    return lanes


def _node_svg(node_id: str, x: int, y: int, lane: int, role: str, is_root: bool, root: str, tip: str) -> str:
    attrs = (
        f'class="gnode role-{role}{" root" if is_root else ""}" data-node-id="{html.escape(node_id)}" '
        f'data-role="{role}" data-root="{html.escape(root)}" data-lane="{lane}"'
    )
    title = f"<title>{html.escape(tip)}</title>"
    if role == "auxiliary":
        r = RADIUS_PX - 1
        shape = f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="#fb923c" stroke="#c2410c"/>'
    elif role == "discarded":
        d = RADIUS_PX - 4
        shape = (
            f'<circle cx="{x}" cy="{y}" r="{RADIUS_PX}" fill="#e5e7eb" stroke="#6b7280" stroke-dasharray="3 2"/>'
            f'<path d="M{x - d} {y - d} L{x + d} {y + d} M{x + d} {y - d} L{x - d} {y + d}" stroke="#6b7280"/>'
        )
    else:
        ring = ' stroke="#1e3a8a" stroke-width="3"' if is_root else ""
        shape = f'<circle cx="{x}" cy="{y}" r="{RADIUS_PX}" fill="#2563eb"{ring}/>'
    return f"<g {attrs}>{title}{shape}</g>"


def render_graph(graph: RolloutGraph, turns: Sequence[TrainingTurn]) -> str:
    """An SVG of the rollout graph with a legend; `turns` supplies the tooltips' facts."""
    if not graph.nodes:
        return "<p>no turns, no graph</p>"
    lanes = _lanes(graph)
    width = 2 * MARGIN_PX + COLUMN_PX * (len(graph.nodes) - 1)
    height = 2 * MARGIN_PX + LANE_PX * max(lanes.values()) + 6  # room for the turn numbers
    pos = {
        node_id: (MARGIN_PX + COLUMN_PX * node.index, MARGIN_PX + LANE_PX * lanes[node_id])
        for node_id, node in graph.nodes.items()
    }
    edges = []
    for node_id, node in graph.nodes.items():
        if node.parent is None:
            continue
        (x1, y1), (x2, y2) = pos[node.parent], pos[node_id]
        dash = ' stroke-dasharray="4 3"' if node.link == "messages" else ""
        path = (
            f"M{x1} {y1} L{x2} {y1}" if y1 == y2 else f"M{x1} {y1} C{x1 + 14} {y2} {x2 - 20} {y2} {x2} {y2}"
        )
        edges.append(f'<path class="gedge" d="{path}" fill="none" stroke="#9ca3af" stroke-width="2"{dash}/>')
    nodes = []
    for node_id, node in graph.nodes.items():
        turn = turns[node.index]
        md = turn.metadata
        tip = (
            f"turn {node.index} · {node_id} · {node.role}"
            f"{' · root' if node.parent is None else f' · parent {node.parent}'}"
            f" · {len(turn.prompt_token_ids)}+{len(turn.completion_token_ids)} tokens, {sum(turn.loss_mask)} trained"
            f" · finish {md.finish_reason or '-'} · policy v{md.policy_version if md.policy_version is not None else '?'}"
        )
        x, y = pos[node_id]
        nodes.append(_node_svg(node_id, x, y, lanes[node_id], node.role, node.parent is None, node.root, tip))
    numbers = "".join(
        f'<text x="{x}" y="{y + RADIUS_PX + 11}" class="turn-label" font-size="9" fill="#6b7280" '
        f'text-anchor="middle">{graph.nodes[n].index}</text>'
        for n, (x, y) in pos.items()
    )
    labels = "".join(
        f'<text x="{pos[r][0] - RADIUS_PX}" y="{pos[r][1] - RADIUS_PX - 3}" class="root-label" font-size="10" fill="#1e3a8a">root</text>'
        for r in graph.roots
    )
    summary = (
        f"{len(graph.nodes)} node(s), {len(graph.roots)} root(s), "
        f"{sum(n.role == 'discarded' for n in graph.nodes.values())} discarded, "
        f"{sum(n.role == 'auxiliary' for n in graph.nodes.values())} auxiliary, {len(graph.leaves())} leaf chain(s)"
    )
    svg = (
        f'<svg class="rollout-graph" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{html.escape(summary)}">{"".join(edges)}{"".join(nodes)}{labels}{numbers}</svg>'
    )
    return (
        f'<p class="graph-summary">{html.escape(summary)}</p>'
        f'<div class="graph-scroll" style="overflow-x:auto">{svg}</div>{_LEGEND}'
    )
