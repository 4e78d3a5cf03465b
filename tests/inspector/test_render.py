"""The rollout page's HTML, from rollouts captured through the real proxy (see conftest) and from
hand-made traces for the edge cases (broken traces, hostile text)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from capture_proxy.models import TrainingTurn, TurnMetadata
from capture_proxy.store import SessionRecord
from engine.imitation import decode_token
from inspector.db import open_readonly
from inspector.graph_view import render_graph
from inspector.queries import StoredRollout, load_rollout
from inspector.render import (
    MAX_CONTEXT_TOKENS_PER_TURN,
    build_view,
    fmt_reward,
    render_findings,
    render_rollout,
    render_tokens,
)


class Spans(HTMLParser):
    """Collects the token spans (their attributes) and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[dict[str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "span" and "tok" in (a.get("class") or "").split() and "data-token-id" in a:
            self.tokens.append(a)


def parse(html: str) -> Spans:
    p = Spans()
    p.feed(html)
    return p


@pytest.fixture
def agent_view(real_rollouts):
    engine = open_readonly(real_rollouts.store_url)
    yield build_view(load_rollout(engine, real_rollouts.agent))
    engine.dispose()


def test_token_spans_carry_id_mask_and_logprob_and_match_the_trace(agent_view):
    turn = agent_view.turns[0]
    spans = [s for s in parse(render_tokens(turn, None, decode_token)).tokens]
    assert [int(s["data-token-id"]) for s in spans] == turn.prompt_token_ids + turn.completion_token_ids
    assert [int(s["data-mask"]) for s in spans] == turn.loss_mask
    completion = spans[len(turn.prompt_token_ids) :]
    assert all("m1" in s["class"].split() for s in completion)
    assert all("m0" in s["class"].split() for s in spans[: len(turn.prompt_token_ids)])
    for span, logp in zip(completion, turn.per_token_logps, strict=True):
        assert f"logprob {logp:.4f}" in span["title"]
        alpha = float(re.fullmatch(r"--a:([0-9.]+)", span["style"]).group(1))
        assert 0.2 <= alpha <= 0.8
    # A less likely token is drawn stronger.
    by_logp = sorted(zip(turn.per_token_logps, completion, strict=True), key=lambda x: x[0])
    assert float(by_logp[0][1]["style"][4:]) >= float(by_logp[-1][1]["style"][4:])


def test_child_turns_show_only_tokens_after_their_parent(agent_view):
    graph = agent_view.graph
    child = agent_view.turns[3]
    parent = agent_view.turns[graph.nodes[graph.nodes[child.node_id].parent].index]
    shared = len(parent.prompt_token_ids) + len(parent.completion_token_ids)
    html = render_tokens(child, parent, decode_token)
    spans = parse(html).tokens
    assert int(spans[0]["data-pos"]) == shared
    assert f"{shared} context token(s) shared with the parent turn" in html


def test_discarded_and_auxiliary_turns_show_no_trained_tokens(agent_view):
    roles = {n.node_id: n.role for n in agent_view.graph.nodes.values()}
    assert roles == {"t0": "agent", "t1": "discarded", "t2": "agent", "t3": "agent", "t4": "auxiliary"}
    html = render_rollout(agent_view, decode_token)
    sections = re.split(r'<details class="turn"', html)[1:]
    for index, section in enumerate(sections):
        masks = {s["data-mask"] for s in parse(section).tokens}
        trained = agent_view.turns[index].node_id in ("t0", "t2", "t3")
        assert ("1" in masks) is trained, index
    assert 'data-role="discarded"' in sections[1] and "tok m0 gen" in sections[1]


def test_page_shows_summary_rewards_findings_graph_and_verifier(agent_view):
    html = render_rollout(agent_view, decode_token)
    assert '<span class="task-id">builtin/hello-world</span>' in html
    assert '<b class="reward">1</b>' in html
    assert "rewards/tests_passed" in html and "rewards/format" in html
    assert "===== 4 passed in 0.12s =====" in html
    assert "discarded_turns" in html and "auxiliary_turns" in html
    assert 'class="rollout-graph"' in html and html.count('class="gnode') == 5
    assert "tool call <b>bash</b>" in html  # the model's tool calls, by name with their arguments
    assert "&quot;command&quot;: &quot;echo hello&quot;" in html
    assert "<th>sandbox_start</th>" in html
    # tool calls by name: asked for by the model (from the trace), run and failed (the harness's report)
    assert re.search(r"<tr><td>bash</td><td>\d+</td><td>2</td><td>1</td></tr>", html)


def test_unscoreable_reward_is_never_shown_as_zero(real_rollouts):
    engine = open_readonly(real_rollouts.store_url)
    html = render_rollout(build_view(load_rollout(engine, real_rollouts.failed)))
    engine.dispose()
    assert '<b class="reward">unscoreable</b>' in html
    assert "verifier gave no reward" in html
    assert fmt_reward(None) == "unscoreable" and fmt_reward(0.0) == "0"


def _turn(node_id: str, prompt: list[int], completion: list[int], **kw) -> TrainingTurn:
    return TrainingTurn(
        node_id=node_id,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        per_token_logps=kw.pop("logps", [-0.5] * len(completion)),
        loss_mask=kw.pop("mask", [0] * len(prompt) + [1] * len(completion)),
        metadata=TurnMetadata(policy_version=1),
        **kw,
    )


def _stored(turns: list[TrainingTurn], **record) -> StoredRollout:
    rec = SessionRecord(
        session_id="s1", api_key_hash="0" * 64, model="m", llm_url="http://x/v1", created_at=0.0, **record
    )
    return StoredRollout(record=rec, turns=turns)


def test_stored_text_is_escaped_everywhere():
    evil = "<script>alert(1)</script>"
    turn = _turn(
        "t0",
        [1, 2],
        [3],
        request={"messages": [{"role": "user", "content": evil}]},
        response={"choices": [{"message": {"role": "assistant", "content": evil}}]},
    )
    html = render_rollout(build_view(_stored([turn], task_id=evil, error=evil)), lambda t: evil)
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_broken_traces_still_render_with_fatal_findings():
    # A trainable prompt position and a logprob > 0: FATAL, listed first; the graph is still drawn.
    turn = _turn("t0", [1, 2], [3], mask=[1, 0, 1], logps=[0.5])
    view = build_view(_stored([turn]))
    html = render_rollout(view)
    assert view.graph is not None
    codes = re.findall(r'<tr class="finding sev-(\w+)"><td>\w+</td><td><code>(\w+)</code>', html)
    assert ("FATAL", "trainable_prompt") in codes and ("FATAL", "positive_logprob") in codes
    # Duplicate node ids: no graph, but the page explains why and shows the turns.
    dup = build_view(_stored([_turn("t0", [1], [2]), _turn("t0", [1, 2, 5], [6])]))
    assert dup.graph is None
    html = render_rollout(dup)
    assert "the rollout graph cannot be built" in html and html.count('<details class="turn"') == 2


def test_long_contexts_are_elided_not_drawn():
    prompt = list(range(MAX_CONTEXT_TOKENS_PER_TURN + 500))
    html = render_tokens(_turn("t0", prompt, [7, 8]), None, None)
    spans = parse(html).tokens
    assert len(spans) == MAX_CONTEXT_TOKENS_PER_TURN + 2
    assert "500 older context token(s) not drawn" in html


def test_findings_are_grouped_by_severity():
    assert "none: the trace is valid" in render_findings([])


def test_graph_lanes_roots_and_message_links():
    # Two roots; the first root has a retry (same prompt, one continued): one branch lane.
    turns = [
        _turn("a", [1, 2], [3]),
        _turn("b", [1, 2, 3, 4], [5]),
        _turn("c", [1, 2, 3, 4], [5]),
        _turn("d", [1, 2, 3, 4, 5, 6], [7]),
        _turn("e", [9, 9], [9]),
    ]
    view = build_view(_stored(turns))
    svg = render_graph(view.graph, view.turns)
    assert svg.count('class="gnode') == 5
    assert svg.count('class="root-label"') == 2
    assert "2 root(s), 1 discarded" in svg
    lanes = dict(re.findall(r'data-node-id="(\w)"[^>]*data-lane="(\d+)"', svg))
    # The continued chain reads straight, the retry branches off, the second root has its own lane.
    assert lanes == {"a": "0", "b": "1", "c": "0", "d": "0", "e": "2"}


def test_token_budget_leaves_later_turns_to_be_shown_one_at_a_time(monkeypatch):
    import inspector.render as render

    monkeypatch.setattr(render, "MAX_TOKENS_PER_PAGE", 20)
    prompt, turns = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], []
    for i in range(4):  # a chain: turn 0 draws 10 + 3 tokens, each later one 1 new context + 3
        completion = [100 + i, 101 + i, 102 + i]
        turns.append(_turn(f"t{i}", prompt, completion))
        prompt = prompt + completion + [50 + i]
    view = build_view(_stored(turns))
    assert [render.drawn_tokens(view, i) for i in range(4)] == [13, 4, 4, 4]
    html = render.render_rollout(view)
    sections = re.split(r'<details class="turn"', html)[1:]
    assert [bool(parse(s).tokens) for s in sections] == [True, True, False, False]
    assert "show them with &ldquo;Tokens of turn&rdquo; 3 above" in sections[3]
    alone = parse(render.render_turn_tokens(view, 3)).tokens
    assert [int(s["data-token-id"]) for s in alone] == [52, 103, 104, 105]
    with pytest.raises(IndexError, match="this rollout has turns 0..3"):
        render.render_turn_tokens(view, 4)
