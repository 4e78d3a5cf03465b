"""Validation (docs/design.md 3.1): each rule, broken alone, yields exactly its own finding."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from capture_proxy.errors import InvalidTraceError
from capture_proxy.models import TrainingTrace, TrainingTurn
from capture_proxy.validation import (
    Finding,
    Severity,
    fatal,
    require_trainable,
    validate_trace,
    validate_turn,
)
from tests.capture.builders import Rollout, trace, turn

Raw = dict[str, Any]


def base() -> Raw:
    """A valid two-call rollout: call b continues call a after a tool output."""
    r = Rollout()
    r.call("a", [20, 21, 22])
    r.tool([30, 31])
    r.call("b", [40, 41])
    return trace(r.turns)


def last(t: Raw) -> Raw:
    return t["turns"][-1]


def set_last(key: str, value: Any) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        last(t)[key] = value

    return mutate


def set_item(key: str, index: int, value: Any) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        last(t)[key][index] = value

    return mutate


def set_meta(**values: Any) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        last(t)["metadata"].update(values)

    return mutate


def drop_last(key: str) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        del last(t)[key]

    return mutate


def empty_prompt(t: Raw) -> None:
    b = last(t)
    b["prompt_token_ids"] = []
    b["loss_mask"] = [1] * len(b["completion_token_ids"])


def empty_completion(t: Raw) -> None:
    b = last(t)
    b["loss_mask"] = [0] * len(b["prompt_token_ids"])
    b["completion_token_ids"] = []
    b["per_token_logps"] = []


def duplicate_id(t: Raw) -> None:
    last(t)["node_id"] = t["turns"][0]["node_id"]


def single_call_multi_step(t: Raw) -> None:
    del t["turns"][1:]
    t["multi_step_task"] = True


def rewrite_history(t: Raw) -> None:
    b = last(t)
    b["prompt_token_ids"] = [1, 2, 3, 90, 91]
    b["loss_mask"] = [0] * 5 + [1] * len(b["completion_token_ids"])


def retry_first_call(t: Raw) -> None:
    a = t["turns"][0]
    t["turns"].insert(1, turn("a-retry", a["prompt_token_ids"], [25, 26]))


def title_call(t: Raw) -> None:
    t["turns"].insert(0, turn("title", [7, 8, 9], [5], tools=False))


def trace_field(key: str, value: Any) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        t[key] = value

    return mutate


def replace_last_turn(value: Any) -> Callable[[Raw], None]:
    def mutate(t: Raw) -> None:
        t["turns"][-1] = value

    return mutate


# (id, mutation, expected code, severity, expected location)
# fmt: off
CASES: list[tuple[str, Callable[[Raw], None], str, Severity, str]] = [
    ("mask_missing", drop_last("loss_mask"), "length_mismatch", Severity.FATAL, "turns[1].loss_mask"),
    ("mask_short", set_last("loss_mask", [0] * 10 + [1]), "length_mismatch", Severity.FATAL, "turns[1].loss_mask"),
    ("mask_two", set_item("loss_mask", -1, 2), "invalid_loss_mask", Severity.FATAL, "turns[1].loss_mask[9]"),
    ("mask_bool", set_item("loss_mask", -1, True), "invalid_loss_mask", Severity.FATAL, "turns[1].loss_mask[9]"),
    ("mask_float", set_item("loss_mask", 0, 0.0), "invalid_loss_mask", Severity.FATAL, "turns[1].loss_mask[0]"),
    ("mask_not_list", set_last("loss_mask", "000"), "invalid_loss_mask", Severity.FATAL, "turns[1].loss_mask"),
    ("prompt_trained", set_item("loss_mask", 4, 1), "trainable_prompt", Severity.FATAL, "turns[1].loss_mask[4]"),
    ("id_negative", set_item("completion_token_ids", 1, -1), "invalid_token_id", Severity.FATAL, "turns[1].completion_token_ids[1]"),
    ("id_bool", set_item("prompt_token_ids", 2, True), "invalid_token_id", Severity.FATAL, "turns[1].prompt_token_ids[2]"),
    ("id_float", set_item("completion_token_ids", 0, 40.0), "invalid_token_id", Severity.FATAL, "turns[1].completion_token_ids[0]"),
    ("id_string", set_item("prompt_token_ids", 0, "1"), "invalid_token_id", Severity.FATAL, "turns[1].prompt_token_ids[0]"),
    ("id_huge", set_item("completion_token_ids", 1, 2**64), "invalid_token_id", Severity.FATAL, "turns[1].completion_token_ids[1]"),
    ("logp_nan", set_item("per_token_logps", 0, math.nan), "invalid_logprob", Severity.FATAL, "turns[1].per_token_logps[0]"),
    ("logp_inf", set_item("per_token_logps", 1, -math.inf), "invalid_logprob", Severity.FATAL, "turns[1].per_token_logps[1]"),
    ("logp_string", set_item("per_token_logps", 0, "-0.5"), "invalid_logprob", Severity.FATAL, "turns[1].per_token_logps[0]"),
    ("logp_bool", set_item("per_token_logps", 0, False), "invalid_logprob", Severity.FATAL, "turns[1].per_token_logps[0]"),
    ("logp_null", set_item("per_token_logps", 1, None), "invalid_logprob", Severity.FATAL, "turns[1].per_token_logps[1]"),
    ("logp_positive", set_item("per_token_logps", 1, 0.25), "positive_logprob", Severity.FATAL, "turns[1].per_token_logps[1]"),
    ("prompt_empty", empty_prompt, "no_prompt_ids", Severity.FATAL, "turns[1].prompt_token_ids"),
    ("prompt_missing", drop_last("prompt_token_ids"), "no_prompt_ids", Severity.FATAL, "turns[1].prompt_token_ids"),
    ("logps_empty", set_last("per_token_logps", []), "no_logprobs", Severity.FATAL, "turns[1].per_token_logps"),
    ("logps_missing", drop_last("per_token_logps"), "no_logprobs", Severity.FATAL, "turns[1].per_token_logps"),
    ("logps_extra", set_last("per_token_logps", [-0.5] * 3), "logprob_misalign", Severity.FATAL, "turns[1].per_token_logps"),
    ("duplicate_id", duplicate_id, "duplicate_node_id", Severity.FATAL, "turns[1].node_id"),
    ("schema_2", trace_field("schema_version", 2), "unknown_schema_version", Severity.FATAL, "schema_version"),
    ("schema_str", trace_field("schema_version", "1"), "unknown_schema_version", Severity.FATAL, "schema_version"),
    ("capture_mismatch", set_meta(capture="token_mismatch", error="token_id:41 != 42"), "unverified_engine_tokens", Severity.FATAL, "turns[1].metadata.capture"),
    ("capture_missing_logps", set_meta(capture="missing_logprobs"), "unverified_engine_tokens", Severity.FATAL, "turns[1].metadata.capture"),
    ("single_call", single_call_multi_step, "degenerate_rollout", Severity.FATAL, "turns"),
    ("turn_extra_key", set_last("surprise", 1), "malformed_turn", Severity.FATAL, "turns[1].surprise"),
    ("turn_empty_id", set_last("node_id", ""), "malformed_turn", Severity.FATAL, "turns[1].node_id"),
    ("turn_bad_meta", set_meta(endpoint="grpc"), "malformed_turn", Severity.FATAL, "turns[1].metadata.endpoint"),
    ("turn_not_object", replace_last_turn(5), "malformed_turn", Severity.FATAL, "turns[1]"),
    ("trace_purpose", trace_field("purpose", "fun"), "malformed_trace", Severity.FATAL, "purpose"),
    ("trace_extra_key", trace_field("surprise", 1), "malformed_trace", Severity.FATAL, "surprise"),
    ("truncated", set_meta(finish_reason="length"), "truncated_turn", Severity.WARN, "turns[1].metadata.finish_reason"),
    ("no_sampled", empty_completion, "no_sampled_ids", Severity.WARN, "turns[1].completion_token_ids"),
    ("rewritten", rewrite_history, "multiple_roots", Severity.WARN, "turns"),
    ("retried", retry_first_call, "discarded_turns", Severity.WARN, "turns"),
    ("title_call", title_call, "auxiliary_turns", Severity.INFO, "turns"),
    ("no_turns", trace_field("turns", []), "empty_trace", Severity.WARN, "turns"),
]
# fmt: on


def test_base_trace_is_clean() -> None:
    assert validate_trace(base()) == []
    assert validate_trace(TrainingTrace.model_validate(base())) == []


@pytest.mark.parametrize(
    ("mutate", "code", "severity", "location"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_rule_yields_exactly_its_finding(
    mutate: Callable[[Raw], None], code: str, severity: Severity, location: str
) -> None:
    raw = base()
    mutate(raw)
    findings = validate_trace(raw)
    assert [(f.code, f.severity, f.location) for f in findings] == [(code, severity, location)], findings
    assert findings[0].message


def test_rules_every_fatal_code_is_covered() -> None:
    codes = {c[2] for c in CASES}
    design = {
        "length_mismatch", "invalid_loss_mask", "trainable_prompt", "invalid_token_id", "invalid_logprob",
        "positive_logprob", "no_prompt_ids", "no_logprobs", "logprob_misalign", "duplicate_node_id",
        "unknown_schema_version", "unverified_engine_tokens", "degenerate_rollout",
        "truncated_turn", "multiple_roots", "discarded_turns", "no_sampled_ids",
    }  # fmt: skip
    assert design <= codes


@pytest.mark.parametrize(
    "mutate", [set_item("per_token_logps", 1, 0.25), set_meta(capture="transport_error")]
)
def test_models_get_the_same_findings_as_raw_mappings(mutate: Callable[[Raw], None]) -> None:
    """Rules that the strict model lets through are checked on models too."""
    raw = base()
    mutate(raw)
    assert validate_trace(TrainingTrace.model_validate(raw)) == validate_trace(raw)


def test_partial_and_all_zero_masks_are_valid() -> None:
    r = Rollout()
    r.call("a", [20, 21, 22], mask=[0, 0, 0, 1, 0, 1])
    r.tool([30])
    r.call("b", [40, 41], mask=[0] * 9)
    assert validate_trace(trace(r.turns)) == []


def test_design_example_turn_is_valid_and_locations_have_no_trace_prefix() -> None:
    good = turn("n", [10, 11], [20, 21, 22], mask=[0, 0, 1, 0, 1])
    assert validate_turn(good) == []
    assert validate_turn(TrainingTurn.model_validate(good), index=4) == []
    bad = turn("n", [10, 11], [20, 21, 22], mask=[1, 0, 1, 0, 1])
    assert [(f.code, f.location) for f in validate_turn(bad)] == [("trainable_prompt", "loss_mask[0]")]
    assert [f.location for f in validate_turn(bad, index=3)] == ["turns[3].loss_mask[0]"]


def test_untrained_turn_may_have_an_unverified_capture() -> None:
    """Rule 9 is about trainable turns: a fully masked turn with a failed capture is kept as context."""
    r = Rollout()
    r.call("a", [20], capture="transport_error", mask=[0, 0, 0, 0], error="upstream reset")
    assert validate_turn(r.turns[0]) == []


def test_recorded_transport_failure_is_kept_with_warnings() -> None:
    """The proxy records a failed engine call with no ids: not trainable, not a broken capture."""
    raw = base()
    messages = last(raw)["request"]["messages"]  # the same request b then retried successfully
    failed = turn("b-failed", [], [], mask=[], messages=messages, capture="transport_error", error="503")
    raw["turns"].insert(1, failed)
    findings = validate_trace(raw)
    assert [(f.code, f.severity) for f in findings] == [
        ("no_prompt_ids", Severity.WARN),
        ("no_sampled_ids", Severity.WARN),
    ]
    failed["loss_mask"] = []
    failed["metadata"]["capture"] = "missing_token_ids"  # any other reason for missing ids is a bug
    assert fatal(validate_trace(raw))[0].code == "no_prompt_ids"


def test_eval_turn_without_engine_ids_is_kept_with_a_warning() -> None:
    """An eval session against an endpoint that returns no token ids keeps the text, untrained."""
    raw = base()
    raw["purpose"] = "eval"
    messages = last(raw)["request"]["messages"]
    raw["turns"].append(turn("c", [], [], mask=[], messages=messages, capture="missing_token_ids"))
    findings = [(f.code, f.severity) for f in validate_trace(raw)]
    assert ("no_prompt_ids", Severity.WARN) in findings
    assert not fatal(validate_trace(raw))
    raw["purpose"] = "train"
    assert fatal(validate_trace(raw))[0].code == "no_prompt_ids"


def test_single_call_is_fine_for_eval_or_single_step_tasks() -> None:
    one = trace([turn("a", [1, 2], [3])], multi_step_task=True, purpose="eval")
    assert validate_trace(one) == []
    assert validate_trace(trace([turn("a", [1, 2], [3])], multi_step_task=False)) == []


def test_several_broken_rules_are_all_reported() -> None:
    raw = base()
    last(raw)["per_token_logps"][0] = 1.0
    last(raw)["loss_mask"][0] = 1
    raw["turns"][0]["metadata"]["finish_reason"] = "length"
    codes = sorted(f.code for f in validate_trace(raw))
    assert codes == ["positive_logprob", "trainable_prompt", "truncated_turn"]


def test_many_bad_values_give_one_finding_that_counts_them() -> None:
    raw = base()
    last(raw)["completion_token_ids"] = [-1, -2]
    findings = validate_trace(raw)
    assert [(f.code, f.location) for f in findings] == [
        ("invalid_token_id", "turns[1].completion_token_ids[0]")
    ]
    assert "(2 such value(s))" in findings[0].message


def test_not_a_trace_at_all() -> None:
    assert [f.code for f in validate_trace([1, 2])] == ["malformed_trace"]  # type: ignore[arg-type]
    assert [f.code for f in validate_turn("turn")] == ["malformed_turn"]  # type: ignore[arg-type]


def test_fatal_filters_fatal_findings() -> None:
    findings = [
        Finding(severity=Severity.WARN, code="truncated_turn", message="m", location="turns[0]"),
        Finding(severity=Severity.FATAL, code="no_logprobs", message="m", location="turns[1]"),
    ]
    assert fatal(findings) == findings[1:]
    assert findings[1].severity == "FATAL"  # a str enum: compares and serialises as its name
    assert findings[1].model_dump(mode="json")["severity"] == "FATAL"


def test_require_trainable_returns_the_model_or_raises_with_the_findings() -> None:
    model = require_trainable(base())
    assert isinstance(model, TrainingTrace)
    assert model.turns[1].node_id == "b"
    raw = base()
    last(raw)["per_token_logps"] = []
    raw["turns"][0]["metadata"]["finish_reason"] = "length"
    with pytest.raises(
        InvalidTraceError, match=r"trace sess-1 cannot be trained on: 1 FATAL.*no_logprobs"
    ) as info:
        require_trainable(raw)
    assert info.value.session_id == "sess-1"
    assert sorted(f.code for f in info.value.findings) == ["no_logprobs", "truncated_turn"]


def test_require_trainable_accepts_warnings() -> None:
    raw = base()
    last(raw)["metadata"]["finish_reason"] = "length"
    assert require_trainable(raw).turns[1].metadata.finish_reason == "length"
