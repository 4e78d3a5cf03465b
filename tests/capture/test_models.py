"""The shared capture models: strict, closed, and identical after a JSON round trip."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from capture_proxy.models import TrainingTrace, TrainingTurn
from tests.capture.builders import Rollout, trace, turn


def _rollout_trace() -> TrainingTrace:
    r = Rollout()
    r.call("a", [20, 21, 22], policy_version=3, finish_reason="tool_calls", latency_s=0.25)
    r.tool([30, 31])
    r.call("b", [40, 41], logps=[-0.125, -2.5])
    raw = trace(
        r.turns, multi_step_task=True, reward=1.0, rewards={"pass": 1.0}, task_id="t", metadata={"k": [1]}
    )
    return TrainingTrace.model_validate(raw)


def test_trace_round_trips_through_json() -> None:
    original = _rollout_trace()
    again = TrainingTrace.model_validate_json(original.model_dump_json())
    assert again == original
    assert again.turns[1].per_token_logps == [-0.125, -2.5]
    assert again.turns[0].metadata.policy_version == 3


def test_trace_round_trips_through_orjson_and_python_dicts() -> None:
    original = _rollout_trace()
    assert (
        TrainingTrace.model_validate(orjson.loads(orjson.dumps(original.model_dump(mode="json")))) == original
    )
    assert TrainingTrace.model_validate(original.model_dump()) == original


def test_design_example_marks_tokens_20_and_22_trainable() -> None:
    t = TrainingTurn.model_validate(turn("n", [10, 11], [20, 21, 22], mask=[0, 0, 1, 0, 1]))
    ids = t.prompt_token_ids + t.completion_token_ids
    assert [tok for tok, m in zip(ids, t.loss_mask, strict=True) if m] == [20, 22]
    assert t.trainable
    assert not TrainingTurn.model_validate(turn("z", [10, 11], [20], mask=[0, 0, 0])).trainable


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_token_ids", [True, 11]),
        ("completion_token_ids", ["20"]),
        ("loss_mask", [0, 0, False]),
        ("per_token_logps", ["-0.5"]),
        ("node_id", ""),
        ("unexpected", 1),
    ],
)
def test_turn_model_is_strict_and_closed(field: str, value: object) -> None:
    raw = turn("n", [10, 11], [20])
    raw[field] = value
    with pytest.raises(ValidationError) as info:
        TrainingTurn.model_validate(raw)
    assert info.value.errors()[0]["loc"][0] == field


def test_trace_rejects_other_schema_versions_and_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="schema_version"):
        TrainingTrace.model_validate(trace([], schema_version=2))
    with pytest.raises(ValidationError, match="extra"):
        TrainingTrace.model_validate(trace([], extra_field=True))
