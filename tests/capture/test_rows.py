"""Training rows (docs/design.md 3.2): merged chains, masks and behaviour logprobs, from hand-built graphs."""

from __future__ import annotations

import dataclasses

import pytest

from capture_proxy.errors import InvalidTraceError
from capture_proxy.rows import TrainingRow, build_training_rows
from tests.capture.builders import Rollout, trace, trace_model, turn


def trained_tokens(row: TrainingRow) -> list[int]:
    return [tok for tok, m in zip(row.input_ids, row.loss_mask, strict=True) if m]


def test_design_example_trains_20_and_22() -> None:
    raw = trace(
        [turn("n", [10, 11], [20, 21, 22], mask=[0, 0, 1, 0, 1], logps=[-0.1, -0.2, -0.3], policy_version=4)]
    )
    [row] = build_training_rows(raw)
    assert row.input_ids == (10, 11, 20, 21, 22)
    assert row.loss_mask == (0, 0, 1, 0, 1)
    assert row.behavior_logps == (0.0, 0.0, -0.1, 0.0, -0.3)
    assert row.node_ids == ("n",) and row.trained_node_ids == ("n",)
    assert row.policy_versions == (4,)
    assert row.session_id == "sess-1"
    assert trained_tokens(row) == [20, 22]
    assert row.num_trained_tokens == 2


def test_linear_chain_merges_into_one_row_with_tool_outputs_as_context() -> None:
    r = Rollout()
    r.call("a", [20, 21], logps=[-0.1, -0.2], policy_version=1)
    r.tool([30, 31])
    r.call("b", [40], logps=[-0.4], policy_version=2)
    r.tool([32])
    r.call("c", [50, 51], logps=[-0.5, -0.6], policy_version=2)
    [row] = build_training_rows(trace_model(r.turns))
    assert row.input_ids == (1, 2, 3, 20, 21, 30, 31, 40, 32, 50, 51)
    assert row.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1)
    assert row.behavior_logps == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.4, 0.0, -0.5, -0.6)
    assert row.node_ids == ("a", "b", "c") == row.trained_node_ids
    assert row.policy_versions == (1, 2, 2)


def test_compaction_gives_a_second_row_with_its_own_tokens_and_logprobs() -> None:
    r = Rollout()
    r.call("a", [20], logps=[-0.1])
    r.tool([30])
    r.call("b", [40], logps=[-0.2])
    compacted = Rollout([1, 2, 3, 70, 71])
    compacted.turns = r.turns
    compacted.call("c", [80, 81], logps=[-0.3, -0.4])
    compacted.tool([32])
    compacted.call("d", [90], logps=[-0.5])
    first, second = build_training_rows(trace(r.turns))
    assert first.input_ids == (1, 2, 3, 20, 30, 40)
    assert first.node_ids == ("a", "b")
    assert trained_tokens(first) == [20, 40]
    assert second.input_ids == (1, 2, 3, 70, 71, 80, 81, 32, 90)
    assert second.node_ids == ("c", "d")
    assert trained_tokens(second) == [80, 81, 90]
    assert [lp for lp in second.behavior_logps if lp] == [-0.3, -0.4, -0.5]


def test_retry_is_not_trained_and_its_row_is_dropped() -> None:
    r = Rollout()
    r.call("a", [20])
    r.tool([30])
    retry = r.fork()
    r.call("b-first", [40, 41])
    retry.call("b", [42])
    retry.tool([31])
    retry.call("c", [50])
    [row] = build_training_rows(trace(r.turns))
    assert row.node_ids == ("a", "b", "c")
    assert trained_tokens(row) == [20, 42, 50]
    assert 40 not in row.input_ids


def test_title_call_is_context_only() -> None:
    r = Rollout()
    r.turns.append(turn("title", [5, 6, 7], [8, 9], tools=False))
    r.call("a", [20])
    r.tool([30])
    r.call("b", [40])
    [row] = build_training_rows(trace(r.turns))
    assert row.node_ids == ("a", "b")
    assert trained_tokens(row) == [20, 40]


def test_branches_train_each_call_exactly_once() -> None:
    """a is continued twice (b1 and b2, same prompt, both continued): two rows, a trained in one."""
    r = Rollout()
    r.call("a", [20])
    other = r.fork()
    r.call("b1", [40])
    other.call("b2", [41])
    r.call("c1", [50])
    other.call("c2", [51])
    rows = build_training_rows(trace(r.turns))
    assert [row.node_ids for row in rows] == [("a", "b1", "c1"), ("a", "b2", "c2")]
    assert [row.trained_node_ids for row in rows] == [("a", "b1", "c1"), ("b2", "c2")]
    assert trained_tokens(rows[0]) == [20, 40, 50]
    assert trained_tokens(rows[1]) == [41, 51]  # 20 is context here
    assert rows[1].input_ids[:4] == (1, 2, 3, 20)
    total_mask = sum(sum(t["loss_mask"]) for t in r.turns)
    assert sum(row.num_trained_tokens for row in rows) == total_mask


def test_rows_without_trained_tokens_are_dropped() -> None:
    """b2 is fully masked and a is trained in b1's row, so b2's row would train nothing."""
    r = Rollout()
    r.call("a", [20])
    other = r.fork()
    r.call("b1", [40])
    other.call("b2", [41], mask=[0] * 5)
    rows = build_training_rows(trace(r.turns))
    assert [(row.node_ids, trained_tokens(row)) for row in rows] == [(("a", "b1"), [20, 40])]
    assert build_training_rows(trace([turn("z", [1, 2], [3], mask=[0, 0, 0])])) == []


def test_a_fully_masked_first_branch_still_carries_its_parent() -> None:
    r = Rollout()
    r.call("a", [20])
    other = r.fork()
    r.call("b1", [40], mask=[0] * 5)
    other.call("b2", [41])
    rows = build_training_rows(trace(r.turns))
    assert [(row.node_ids, trained_tokens(row)) for row in rows] == [(("a", "b1"), [20]), (("a", "b2"), [41])]


def test_transport_failure_between_calls_is_left_out_of_rows() -> None:
    r = Rollout()
    r.call("a", [20])
    r.tool([30])
    failed = turn("b-failed", [], [], mask=[], capture="transport_error", messages=r.messages)
    r.turns.append(failed)
    r.call("b", [40])  # the agent retried the same request and got an answer
    [row] = build_training_rows(trace(r.turns))
    assert row.node_ids == ("a", "b")
    assert trained_tokens(row) == [20, 40]


def test_invalid_trace_raises_with_findings() -> None:
    raw = trace([turn("a", [1, 2], [3], logps=[0.5])])
    with pytest.raises(InvalidTraceError) as info:
        build_training_rows(raw)
    assert [f.code for f in info.value.findings] == ["positive_logprob"]
    assert info.value.session_id == "sess-1"


def test_rows_are_frozen() -> None:
    [row] = build_training_rows(trace([turn("a", [1, 2], [3])]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.session_id = "other"  # type: ignore[misc]


def test_long_rollout_builds_one_row() -> None:
    r = Rollout()
    for i in range(300):
        r.call(f"n{i}", [100 + i % 7, 8])
        r.tool([9])
    [row] = build_training_rows(trace(r.turns))
    assert len(row.node_ids) == 300
    assert row.num_trained_tokens == 600
    assert len(row.input_ids) == 3 + 300 * 2 + 299


@pytest.mark.parametrize("seed", range(20))
def test_every_agent_token_is_trained_exactly_once_on_random_trees(seed: int) -> None:
    """Random rollouts with retries, branches and new roots: the rows together train exactly the agent
    calls' masked tokens, once each, with their own logprobs, at positions that hold those tokens."""
    import random

    from capture_proxy.graph import build_rollout_graph

    rng = random.Random(seed)
    seqs: list[list[int]] = []
    raw = []
    for i in range(30):
        if seqs and rng.random() < 0.85:
            prompt = rng.choice(seqs[-5:]) + [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        else:
            prompt = [rng.randint(1, 3) for _ in range(rng.randint(1, 4))]
        completion = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
        mask = [0] * len(prompt) + [rng.randint(0, 1) for _ in completion]
        logps = [-round(rng.random(), 3) for _ in completion]
        raw.append(turn(f"n{i}", prompt, completion, mask=mask, logps=logps, tools=rng.random() < 0.9))
        seqs.append(prompt + completion)
    model = trace_model(raw)
    graph = build_rollout_graph(model.turns)
    rows = build_training_rows(model)

    by_id = {t.node_id: t for t in model.turns}
    expected = {
        (n.node_id, j)
        for n in graph.nodes.values()
        if n.role == "agent"
        for j, m in enumerate(by_id[n.node_id].loss_mask)
        if m
    }
    seen: list[tuple[str, int]] = []
    for row in rows:
        leaf = by_id[row.node_ids[-1]]
        assert row.input_ids == tuple(leaf.prompt_token_ids + leaf.completion_token_ids)
        assert row.num_trained_tokens > 0
        for node_id in row.trained_node_ids:
            t = by_id[node_id]
            start = len(t.prompt_token_ids)
            for k, (tok, m, lp) in enumerate(
                zip(t.completion_token_ids, t.loss_mask[start:], t.per_token_logps, strict=True)
            ):
                assert row.input_ids[start + k] == tok
                assert row.loss_mask[start + k] == m
                assert row.behavior_logps[start + k] == (lp if m else 0.0)
                if m:
                    seen.append((node_id, start + k))
    assert sorted(seen) == sorted(expected)
    assert sum(row.num_trained_tokens for row in rows) == len(expected)
