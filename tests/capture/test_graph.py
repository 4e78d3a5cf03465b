"""The rollout graph (docs/design.md 3.2) on hand-built rollouts."""

from __future__ import annotations

import pytest

from capture_proxy.errors import InvalidTraceError
from capture_proxy.graph import build_rollout_graph, finalize_trace
from capture_proxy.models import TrainingTurn
from capture_proxy.validation import validate_trace
from tests.capture.builders import Rollout, models, trace, trace_model, turn


def parents(graph) -> dict[str, str | None]:
    return {n.node_id: n.parent for n in graph.nodes.values()}


def roles(graph) -> dict[str, str]:
    return {n.node_id: n.role for n in graph.nodes.values()}


def test_linear_chain() -> None:
    r = Rollout()
    r.call("a", [20, 21])
    r.tool([30])
    r.call("b", [40])
    r.tool([31, 32])
    r.call("c", [50, 51, 52])
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a": None, "b": "a", "c": "b"}
    assert graph.roots == ["a"]
    assert {n.root for n in graph.nodes.values()} == {"a"}
    assert set(roles(graph).values()) == {"agent"}
    assert graph.nodes["a"].children == ["b"]
    assert graph.nodes["c"].link == "tokens"
    assert graph.chain("c") == ["a", "b", "c"]
    assert graph.leaves() == ["c"]


def test_links_to_the_longest_prefix_not_just_any() -> None:
    """Every earlier call's sequence prefixes c's prompt; the longest (b) is its parent."""
    r = Rollout()
    r.call("a", [20])
    r.call("b", [21])  # no tool output between: b's prompt is exactly a's prompt + completion
    r.call("c", [22])
    assert parents(build_rollout_graph(models(r.turns))) == {"a": None, "b": "a", "c": "b"}


def test_compaction_in_the_middle_opens_a_new_root() -> None:
    r = Rollout()
    r.call("a", [20, 21])
    r.tool([30])
    r.call("b", [40])
    compacted = Rollout([1, 2, 3, 70, 71])  # the harness summarised the history into [70, 71]
    compacted.turns = r.turns
    compacted.call("c", [80, 81], logps=[-0.1, -0.2])
    compacted.tool([32])
    compacted.call("d", [90])
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a": None, "b": "a", "c": None, "d": "c"}
    assert graph.roots == ["a", "c"]
    assert graph.nodes["d"].root == "c"
    assert set(roles(graph).values()) == {"agent"}
    assert [f.code for f in validate_trace(trace(r.turns))] == ["multiple_roots"]


def test_retry_is_discarded() -> None:
    r = Rollout()
    r.call("a", [20])
    r.tool([30])
    retry = r.fork()
    r.call("b-first", [40, 41])  # the harness retried this call with the same prompt ...
    retry.call("b-retry", [42])
    retry.tool([31])
    retry.call("c", [50])  # ... and continued the retry
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a": None, "b-first": "a", "b-retry": "a", "c": "b-retry"}
    assert roles(graph) == {"a": "agent", "b-first": "discarded", "b-retry": "agent", "c": "agent"}
    assert [f.code for f in validate_trace(trace(r.turns))] == ["discarded_turns"]


def test_same_prompt_siblings_both_continued_are_branches_not_retries() -> None:
    r = Rollout()
    r.call("a", [20])
    other = r.fork()
    r.call("b1", [40])
    other.call("b2", [41])
    r.call("c1", [50])
    other.call("c2", [51])
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a": None, "b1": "a", "b2": "a", "c1": "b1", "c2": "b2"}
    assert set(roles(graph).values()) == {"agent"}


def test_title_call_beside_tool_calls_is_auxiliary() -> None:
    title = turn("title", [5, 6, 7], [8, 9], tools=False)
    r = Rollout()
    r.turns.append(title)
    r.call("a", [20])
    r.tool([30])
    r.call("b", [40])
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"title": None, "a": None, "b": "a"}
    assert roles(graph) == {"title": "auxiliary", "a": "agent", "b": "agent"}
    # opencode's title call is a side call, not rewritten history: no multiple_roots warning.
    assert [f.code for f in validate_trace(trace(r.turns))] == ["auxiliary_turns"]


def test_tool_less_calls_are_agent_turns_when_no_call_uses_tools() -> None:
    r = Rollout()
    r.call("a", [20], tools=False)
    r.call("b", [21], tools=False)
    assert set(roles(build_rollout_graph(models(r.turns))).values()) == {"agent"}


def test_message_prefix_fallback_for_a_turn_without_token_ids() -> None:
    """A call whose ids were not captured links by its request messages: the parent's request messages
    plus the parent's reply (replayed by the agent without the null fields the API sent)."""
    r = Rollout()
    r.call("a", [20, 21])
    r.tool([30])
    r.call("b", [40])
    r.tool([31])
    no_ids = r.call("c", [])
    no_ids["prompt_token_ids"] = []
    no_ids["loss_mask"] = []
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a": None, "b": "a", "c": "b"}
    assert graph.nodes["c"].link == "messages"


def test_token_ids_win_over_messages() -> None:
    """Messages could say c continues b, but c's tokens say otherwise (history rewritten): a new root."""
    r = Rollout()
    r.call("a", [20])
    r.tool([30])
    r.call("b", [40])
    c = r.call("c", [50])
    c["prompt_token_ids"] = [1, 2, 3, 99]
    c["loss_mask"] = [0, 0, 0, 0, 1]
    assert parents(build_rollout_graph(models(r.turns))) == {"a": None, "b": "a", "c": None}


def test_longest_match_off_the_previous_calls_path() -> None:
    """A retry that sampled a prefix of the first attempt's tokens: the previous call (the retry) matches
    the next prompt, but the first attempt matches longer, so it is the parent."""
    r = Rollout()
    first = r.fork()
    first.call("a-first", [20, 21, 22])
    r.call("a-retry", [20])
    first.tool([30])
    first.call("b", [40])
    graph = build_rollout_graph(models(r.turns))
    assert parents(graph) == {"a-first": None, "a-retry": None, "b": "a-first"}
    assert roles(graph)["a-retry"] == "discarded"


def test_duplicate_node_ids_raise() -> None:
    turns = models([turn("a", [1], [2]), turn("a", [1, 2], [3])])
    with pytest.raises(InvalidTraceError, match="duplicate_node_id"):
        build_rollout_graph(turns)


def test_token_ids_beyond_int64_raise() -> None:
    with pytest.raises(InvalidTraceError, match="invalid_token_id"):
        build_rollout_graph(models([turn("a", [1], [2**64])]))


def test_finalize_sets_parent_and_role_and_zeroes_non_agent_masks() -> None:
    r = Rollout()
    r.turns.append(turn("title", [5, 6], [7], tools=False))
    r.call("a", [20])
    r.tool([30])
    retry = r.fork()
    r.call("b-first", [40])
    retry.call("b", [41])
    retry.call("c", [50])
    original = trace_model(r.turns)
    final = finalize_trace(original)
    meta = {t.node_id: (t.metadata.parent_node_id, t.metadata.role, t.trainable) for t in final.turns}
    assert meta == {
        "title": (None, "auxiliary", False),
        "a": (None, "agent", True),
        "b-first": ("a", "discarded", False),
        "b": ("a", "agent", True),
        "c": ("b", "agent", True),
    }
    assert all(t.trainable and t.metadata.parent_node_id is None for t in original.turns)  # untouched
    assert final.turns[2].completion_token_ids == original.turns[2].completion_token_ids
    assert {f.code for f in validate_trace(final)} == {"discarded_turns", "auxiliary_turns"}
    assert type(final).model_validate_json(final.model_dump_json()) == final


def _linear_turns(n: int) -> list[TrainingTurn]:
    prompt: list[int] = [1, 2, 3]
    turns = []
    for i in range(n):
        completion = [100 + i % 50, 7]
        turns.append(
            TrainingTurn.model_construct(
                node_id=f"n{i}",
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                per_token_logps=[-0.5, -0.5],
                loss_mask=[0] * len(prompt) + [1, 1],
                request={"tools": [{}]},
                response={},
            )
        )
        prompt = prompt + completion + [9]
    return turns


def test_linking_a_long_chain_is_linear_in_turns() -> None:
    """2,000 calls: one sequence comparison per call, not one per earlier call."""
    graph = build_rollout_graph(_linear_turns(2000))
    assert graph.roots == ["n0"]
    assert graph.nodes["n1999"].parent == "n1998"
    assert graph.comparisons <= 2000
    assert build_rollout_graph(_linear_turns(1000)).comparisons * 2 >= graph.comparisons - 2


def test_a_repeated_retry_early_on_keeps_linking_linear() -> None:
    """A retry that sampled the same tokens makes its branch point ambiguous; later calls still cost a
    bounded number of comparisons each."""
    turns = _linear_turns(1000)
    dup = turns[1].model_copy(update={"node_id": "n1-again"})
    turns.insert(2, dup)
    graph = build_rollout_graph(turns)
    assert graph.nodes["n2"].parent in {"n1", "n1-again"}
    assert graph.nodes["n999"].parent == "n998"
    assert graph.comparisons <= 4 * len(turns)


def _reference_parents(turns: list[TrainingTurn]) -> dict[str, str | None]:
    """The definition, checked the slow way: the longest earlier sequence that prefixes the prompt,
    the later call on a tie."""
    out: dict[str, str | None] = {}
    for i, t in enumerate(turns):
        best: tuple[int, int] | None = None
        for j in range(i):
            seq = turns[j].prompt_token_ids + turns[j].completion_token_ids
            if t.prompt_token_ids[: len(seq)] == seq and len(seq) <= len(t.prompt_token_ids):
                best = max(best or (-1, -1), (len(seq), j))
        out[t.node_id] = None if best is None else turns[best[1]].node_id
    return out


@pytest.mark.parametrize("seed", range(40))
def test_linking_matches_the_definition_on_random_trees(seed: int) -> None:
    """Random rollouts over a three-token alphabet: identical retries, retries whose output is a prefix
    of another's, branches and new roots all occur; the fast linker must agree with the definition."""
    import random

    rng = random.Random(seed)
    seqs: list[list[int]] = []
    raw = []
    for i in range(40):
        if seqs and rng.random() < 0.85:
            base = rng.choice(seqs[-6:] if rng.random() < 0.7 else seqs)
            prompt = base + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        else:
            prompt = [rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
        completion = [rng.randint(1, 3) for _ in range(rng.randint(0, 3))]
        raw.append(turn(f"n{i}", prompt, completion))
        seqs.append(prompt + completion)
    turns = models(raw)
    assert parents(build_rollout_graph(turns)) == _reference_parents(turns)
