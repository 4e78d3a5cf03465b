"""Our TrainingTrace against OpenEnv's own (openenv 0.10.0, `openenv/core/harness/training.py`): each reads
the other's JSON, and on every single-rule mutation the two reach the same verdict (OpenEnv's strict
model refuses exactly the traces our validator finds FATAL)."""

from __future__ import annotations

import copy
import math

import pytest
from openenv.core.harness import TrainingTrace as OpenEnvTrace
from pydantic import ValidationError

from capture_proxy.models import TrainingTrace
from capture_proxy.validation import fatal, validate_trace


def _turn(node_id: str, prompt: list[int], completion: list[int], mask_tail: list[int]) -> dict:
    return {
        "node_id": node_id,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "per_token_logps": [-0.25 - 0.1 * i for i in range(len(completion))],
        "loss_mask": [0] * len(prompt) + mask_tail,
        "request": {"messages": [{"role": "user", "content": "fix the bug"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "done"}}]},
        "metadata": {"source": "openenv"},
    }


VALID = {
    "schema_version": 1,
    "turns": [
        _turn("call-0", [10, 11], [20, 21, 22], [1, 0, 1]),
        _turn("call-1", [10, 11, 20, 21, 22, 30], [40, 41], [1, 1]),
        _turn("call-2", [5], [6], [0]),  # fully masked: kept for context
    ],
}


def _mutate(path: tuple, value) -> dict:
    trace = copy.deepcopy(VALID)
    target = trace
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return trace


MUTATIONS = {
    "length_mismatch": _mutate(("turns", 0, "loss_mask"), [0, 0, 1]),
    "invalid_loss_mask: 2": _mutate(("turns", 0, "loss_mask"), [0, 0, 2, 0, 1]),
    "invalid_loss_mask: bool": _mutate(("turns", 0, "loss_mask"), [0, 0, True, 0, 1]),
    "trainable_prompt": _mutate(("turns", 0, "loss_mask"), [1, 0, 1, 0, 1]),
    "invalid_token_id: negative": _mutate(("turns", 0, "prompt_token_ids"), [10, -1]),
    "invalid_token_id: bool": _mutate(("turns", 0, "completion_token_ids"), [20, True, 22]),
    "invalid_token_id: float": _mutate(("turns", 1, "completion_token_ids"), [40, 41.0]),
    "invalid_logprob: nan": _mutate(("turns", 0, "per_token_logps"), [-0.1, math.nan, -0.3]),
    "invalid_logprob: inf": _mutate(("turns", 0, "per_token_logps"), [-0.1, -math.inf, -0.3]),
    "invalid_logprob: text": _mutate(("turns", 0, "per_token_logps"), [-0.1, "x", -0.3]),
    "positive_logprob": _mutate(("turns", 1, "per_token_logps"), [-0.1, 0.5]),
    "no_prompt_ids": _mutate(("turns", 2, "prompt_token_ids"), []),
    "logprob_misalign": _mutate(("turns", 1, "per_token_logps"), [-0.1]),
    "no_logprobs": _mutate(("turns", 1, "per_token_logps"), []),
    "duplicate_node_id": _mutate(("turns", 1, "node_id"), "call-0"),
    "empty_node_id": _mutate(("turns", 1, "node_id"), ""),
    "unknown_schema_version": _mutate(("schema_version",), 2),
}


def _openenv_accepts(trace: dict) -> bool:
    try:
        OpenEnvTrace.model_validate(copy.deepcopy(trace))
    except ValidationError:
        return False
    return True


def _we_accept(trace: dict) -> bool:
    return not fatal(validate_trace(copy.deepcopy(trace)))


def test_both_accept_the_valid_trace() -> None:
    assert _openenv_accepts(VALID) and _we_accept(VALID)


@pytest.mark.parametrize("rule", sorted(MUTATIONS))
def test_the_same_verdict_on_each_single_rule_mutation(rule: str) -> None:
    trace = MUTATIONS[rule]
    assert _openenv_accepts(trace) is False
    assert _we_accept(trace) is False, validate_trace(trace)


def _tokens(trace) -> list[tuple]:
    return [
        (
            t.node_id,
            list(t.prompt_token_ids),
            list(t.completion_token_ids),
            list(t.per_token_logps),
            list(t.loss_mask),
        )
        for t in trace.turns
    ]


def test_an_openenv_trace_round_trips_through_ours() -> None:
    theirs = OpenEnvTrace.model_validate(copy.deepcopy(VALID))
    ours = TrainingTrace.model_validate(theirs.model_dump(mode="json"))
    assert ours.session_id is None and _tokens(ours) == _tokens(theirs)
    assert ours.turns[0].metadata.model_dump()["source"] == "openenv"  # their metadata survives
    back = OpenEnvTrace.model_validate(ours.to_openenv())
    assert _tokens(back) == _tokens(theirs) and back.turns[0].metadata["source"] == "openenv"
    assert ours.model_validate_json(ours.model_dump_json()) == ours


def test_trace_entries_match_openenvs_and_come_back() -> None:
    theirs = OpenEnvTrace.model_validate(copy.deepcopy(VALID))
    ours = TrainingTrace.model_validate(copy.deepcopy(VALID), strict=False)
    entries = ours.to_trace_entries()
    expected = theirs.to_trace_entries()
    for mine, their in zip(entries, expected, strict=True):
        assert {k: mine[k] for k in their if k != "metadata"} == {
            k: v for k, v in their.items() if k != "metadata"
        }
        assert mine["metadata"]["node_id"] == their["metadata"]["node_id"]
        assert their["metadata"].items() <= mine["metadata"].items()
    assert _tokens(OpenEnvTrace.from_entries(entries)) == _tokens(theirs)
    again = TrainingTrace.from_entries(expected, session_id="s-1")
    assert again.session_id == "s-1" and _tokens(again) == _tokens(theirs)


def test_a_stored_trace_exports_to_openenvs_strict_model() -> None:
    ours = TrainingTrace(session_id="s-9", purpose="train", multi_step_task=True, status="completed",
                         turns=TrainingTrace.model_validate(copy.deepcopy(VALID)).turns, reward=1.0)  # fmt: skip
    exported = OpenEnvTrace.model_validate(ours.to_openenv())
    assert _tokens(exported) == _tokens(ours)
    assert exported.turns[0].metadata["policy_version"] is None  # our provenance rides along in metadata
