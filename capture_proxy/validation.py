"""Validation of captured turns and traces (docs/design.md 3.1).

Every rule yields a `Finding` with a severity and a stable code. The rules run on models and on raw
mappings (JSON as the proxy or a client received it). A raw trace goes through the strict model first
(one fast pass that settles every type); if that fails, the rules read the raw values themselves, so a
bool token id still surfaces as `invalid_token_id` rather than as a generic type error, and the strict
model's remaining complaints, those no rule covers, become `malformed_turn` / `malformed_trace`.
A trace with any FATAL finding cannot be trained on (`require_trainable`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from capture_proxy.errors import InvalidTraceError
from capture_proxy.findings import Finding, Severity, fatal
from capture_proxy.graph import RolloutGraph, build_rollout_graph
from capture_proxy.models import SCHEMA_VERSION, TrainingTrace, TrainingTurn

__all__ = [
    "Finding",
    "Severity",
    "fatal",
    "require_trainable",
    "require_trainable_graph",
    "validate_trace",
    "validate_turn",
]

_MISSING: Any = object()

_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids")
_GRAPH_BREAKING = frozenset({"duplicate_node_id", "invalid_token_id"})
"""With these the rollout graph cannot be built (nodes are keyed by id, tokens compared as int64)."""
_MAX_TOKEN_ID = 2**63 - 1
"""Token ids are stored and compared as int64; no vocabulary comes near."""


def validate_turn(turn: TrainingTurn | Mapping[str, Any], *, index: int | None = None) -> list[Finding]:
    """All findings for one turn. `index` (its position in a trace) prefixes locations with `turns[i].`."""
    prefix = "" if index is None else f"turns[{index}]."
    if isinstance(turn, TrainingTurn):
        return _turn_rules(turn, prefix, typed=True)[0]
    if not isinstance(turn, Mapping):
        return [_fatal("malformed_turn", f"a turn must be an object, got {type(turn).__name__}", prefix[:-1])]
    try:
        # Types first, in one strict pass: then the rules only need to look at values.
        return _turn_rules(TrainingTurn.model_validate(turn), prefix, typed=True)[0]
    except ValidationError as exc:
        errors = exc.errors()
    findings, claimed = _turn_rules(turn, prefix, typed=False)
    return findings + _structural(errors, "malformed_turn", prefix, claimed)


def validate_trace(trace: TrainingTrace | Mapping[str, Any]) -> list[Finding]:
    """All findings for a trace: each turn's, then the trace-level and rollout-graph ones."""
    return _check_trace(trace)[0]


def require_trainable(trace: TrainingTrace | Mapping[str, Any]) -> TrainingTrace:
    """The trace as a model, or InvalidTraceError carrying every finding when any is FATAL."""
    return require_trainable_graph(trace)[0]


def require_trainable_graph(trace: TrainingTrace | Mapping[str, Any]) -> tuple[TrainingTrace, RolloutGraph]:
    """`require_trainable`, plus the rollout graph its checks built (so callers need not build it again)."""
    findings, model, graph = _check_trace(trace)
    if fatal(findings) or model is None or graph is None:
        session_id = _get(trace, "session_id", None)
        raise InvalidTraceError(findings, session_id if isinstance(session_id, str) else None)
    return model, graph


def _tolerate_eval_gaps(findings: list[Finding], turns: Sequence[TrainingTurn]) -> list[Finding]:
    """Eval sessions may talk to endpoints that return no token ids (a hosted API): such untrained turns
    are kept for their text, so their missing ids are a warning there, not a broken capture."""
    gaps = {
        f"turns[{i}].prompt_token_ids"
        for i, t in enumerate(turns)
        if t.metadata.capture == "missing_token_ids" and not t.trainable
    }
    return [
        f.model_copy(update={"severity": Severity.WARN})
        if f.code == "no_prompt_ids" and f.location in gaps
        else f
        for f in findings
    ]


def _check_trace(
    trace: TrainingTrace | Mapping[str, Any],
) -> tuple[list[Finding], TrainingTrace | None, RolloutGraph | None]:
    if isinstance(trace, Mapping):
        try:
            trace = TrainingTrace.model_validate(trace)
        except ValidationError as exc:
            errors = exc.errors()
    if isinstance(trace, TrainingTrace):
        turns: Sequence[Any] = trace.turns
        findings = [f for i, t in enumerate(turns) for f in _turn_rules(t, f"turns[{i}].", typed=True)[0]]
        if trace.purpose == "eval":
            findings = _tolerate_eval_gaps(findings, turns)
        model: TrainingTrace | None = trace
    elif isinstance(trace, Mapping):
        # Not a valid model: find which rules broke on the raw values (the slow path).
        findings, turns = _validate_raw_trace(trace, errors)
        model = None
    else:
        return (
            [_fatal("malformed_trace", f"a trace must be an object, got {type(trace).__name__}", "")],
            None,
            None,
        )
    findings += _trace_rules(trace, turns)
    if model is None or any(f.code in _GRAPH_BREAKING for f in findings):
        return findings, model, None

    graph = build_rollout_graph(model.turns)
    return findings + _graph_findings(graph), model, graph


# ---------------------------------------------------------------------------------------------------
# Turn rules (docs/design.md 3.1, FATAL 1-7 and 9; WARN truncated_turn, no_sampled_ids)


def _turn_rules(turn: Any, prefix: str, *, typed: bool) -> tuple[list[Finding], set[tuple[str, ...]]]:
    """Findings of the per-turn rules, and the field paths they claimed (see `_structural`).

    `typed`: the turn passed the strict model, so its lists hold ints (no bools) and floats, and only
    values need checking, with C-level list methods: a 2,000-call trace holds millions of tokens.
    """
    findings: list[Finding] = []
    claimed: set[tuple[str, ...]] = set()

    def add(finding: Finding, *field: str) -> None:
        findings.append(finding)
        claimed.add(field)

    prompt = _get(turn, "prompt_token_ids")
    completion = _get(turn, "completion_token_ids")
    logps = _get(turn, "per_token_logps")
    mask = _get(turn, "loss_mask")

    metadata = _get(turn, "metadata", None)
    capture = _get(metadata, "capture", "ok")
    if prompt is _MISSING or prompt is None or (isinstance(prompt, list) and not prompt):
        # A call recorded as a transport failure got nothing back: it is kept, untrained, to account
        # for the call (the proxy flags its rollout unscoreable). Anything else without ids is a bug.
        failed_call = capture == "transport_error" and not _is_trainable(mask, typed)
        finding = Finding(
            severity=Severity.WARN if failed_call else Severity.FATAL,
            code="no_prompt_ids",
            message="the turn has no prompt token ids" + (" (transport failure)" if failed_call else ""),
            location=f"{prefix}prompt_token_ids",
        )
        add(finding, "prompt_token_ids")
    for field, ids in zip(_TOKEN_FIELDS, (prompt, completion), strict=True):
        if isinstance(ids, list) and (bad := _first_bad_token_id(ids, typed)) is not None:
            add(_bad_token_finding(ids, bad, f"{prefix}{field}"), field)

    if isinstance(completion, list) and not completion:
        findings.append(
            _warn("no_sampled_ids", "the turn has no sampled token ids", f"{prefix}completion_token_ids")
        )
    findings += _logprob_findings(completion, logps, prefix, claimed)
    findings += _mask_findings(prompt, completion, mask, prefix, claimed, typed)

    if _get(metadata, "finish_reason", None) == "length":
        findings.append(
            _warn(
                "truncated_turn",
                "the completion stopped at the token limit",
                f"{prefix}metadata.finish_reason",
            )
        )
    if capture != "ok" and _is_trainable(mask, typed):
        error = _get(metadata, "error", None)
        detail = f": {error}" if error else ""
        add(
            _fatal(
                "unverified_engine_tokens",
                f"the turn is trainable but its engine tokens or logprobs were not captured intact (capture={capture!r}){detail}",
                f"{prefix}metadata.capture",
            ),
            "metadata",
            "capture",
        )
    return findings, claimed


def _logprob_findings(
    completion: Any, logps: Any, prefix: str, claimed: set[tuple[str, ...]]
) -> list[Finding]:
    where = f"{prefix}per_token_logps"
    sampled = len(completion) if isinstance(completion, list) else 0
    if logps is _MISSING or logps is None or (isinstance(logps, list) and not logps):
        if sampled:
            claimed.add(("per_token_logps",))
            return [_fatal("no_logprobs", f"{sampled} sampled token(s) but no logprobs", where)]
        return []
    if not isinstance(logps, list):
        return []  # not a list at all: the strict model reports it as malformed
    findings: list[Finding] = []
    if isinstance(completion, list) and len(logps) != sampled:
        claimed.add(("per_token_logps",))
        findings.append(
            _fatal("logprob_misalign", f"{len(logps)} logprobs for {sampled} sampled token(s)", where)
        )
    if not set(map(type, logps)) - {float, int}:
        with contextlib.suppress(OverflowError):
            values = np.asarray(logps, dtype=np.float64)
            if np.isfinite(values).all() and (values <= 0).all():
                return findings  # the common case, checked in C; the scans below only locate what is wrong
    non_numeric = [i for i, v in enumerate(logps) if not _is_finite_number(v)]
    if non_numeric:
        claimed.add(("per_token_logps",))
        i = non_numeric[0]
        findings.append(
            _fatal(
                "invalid_logprob",
                f"logprob {logps[i]!r} is not a finite number ({len(non_numeric)} such value(s))",
                f"{where}[{i}]",
            )
        )
    positive = [i for i, v in enumerate(logps) if _is_finite_number(v) and v > 0]
    if positive:
        i = positive[0]
        findings.append(
            _fatal(
                "positive_logprob",
                f"logprob {logps[i]!r} is > 0 ({len(positive)} such value(s))",
                f"{where}[{i}]",
            )
        )
    return findings


def _mask_findings(
    prompt: Any, completion: Any, mask: Any, prefix: str, claimed: set[tuple[str, ...]], typed: bool
) -> list[Finding]:
    where = f"{prefix}loss_mask"
    if mask is _MISSING or mask is None:
        claimed.add(("loss_mask",))
        return [_fatal("length_mismatch", "the turn has no loss_mask", where)]
    if not isinstance(mask, list):
        claimed.add(("loss_mask",))
        return [
            _fatal("invalid_loss_mask", f"loss_mask must be a list of 0/1, got {type(mask).__name__}", where)
        ]
    findings: list[Finding] = []
    if (
        isinstance(prompt, list)
        and isinstance(completion, list)
        and len(mask) != len(prompt) + len(completion)
    ):
        claimed.add(("loss_mask",))
        findings.append(
            _fatal(
                "length_mismatch",
                f"loss_mask has {len(mask)} values for {len(prompt)} prompt + {len(completion)} completion tokens",
                where,
            )
        )
    if (
        (mask.count(0) + mask.count(1) != len(mask))
        if typed
        else (set(map(type, mask)) - {int} or not set(mask) <= {0, 1})
    ):
        i = next(i for i, v in enumerate(mask) if type(v) is not int or v not in (0, 1))
        claimed.add(("loss_mask",))
        findings.append(
            _fatal("invalid_loss_mask", f"mask value {mask[i]!r} is not the int 0 or 1", f"{where}[{i}]")
        )
    n_prompt = len(prompt) if isinstance(prompt, list) else 0
    # The first 1 of a valid mask lies in the completion: finding it scans the prompt part in C.
    first_one = next(iter(_indices(mask, 1)), None) if typed else None
    if not typed or (first_one is not None and first_one < n_prompt):
        prompt_part = mask[:n_prompt]
        trained_prompt = [i for i, v in enumerate(prompt_part) if type(v) is int and v == 1]
    else:
        trained_prompt = []
    if trained_prompt:
        i = trained_prompt[0]
        findings.append(
            _fatal(
                "trainable_prompt",
                f"{len(trained_prompt)} prompt position(s) are marked trainable; only sampled tokens can be",
                f"{where}[{i}]",
            )
        )
    return findings


def _first_bad_token_id(ids: list[Any], typed: bool) -> int | None:
    # Fast path in C for the common all-valid case; the slow scan only runs to locate a bad value.
    if (typed or not set(map(type, ids)) - {int}) and (
        not ids or (min(ids) >= 0 and max(ids) <= _MAX_TOKEN_ID)
    ):
        return None
    return next(i for i, v in enumerate(ids) if not _is_token_id(v))


def _bad_token_finding(ids: list[Any], i: int, where: str) -> Finding:
    bad = sum(1 for v in ids if not _is_token_id(v))
    return _fatal(
        "invalid_token_id",
        f"token id {ids[i]!r} is not a non-negative int ({bad} such value(s))",
        f"{where}[{i}]",
    )


def _is_token_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_TOKEN_ID


def _is_finite_number(value: Any) -> bool:
    try:
        return type(value) in (int, float) and math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _is_trainable(mask: Any, typed: bool) -> bool:
    if not isinstance(mask, list) or 1 not in mask:
        return False
    return typed or any(type(v) is int and v == 1 for v in mask)


def _indices(values: list[Any], value: Any) -> Iterator[int]:
    """Positions of `value` in `values`, found by list.index (C speed)."""
    start = 0
    while True:
        try:
            start = values.index(value, start)
        except ValueError:
            return
        yield start
        start += 1


# ---------------------------------------------------------------------------------------------------
# Trace rules (FATAL 8 and 10) and the graph's warnings


def _validate_raw_trace(trace: Mapping[str, Any], errors: list[Any]) -> tuple[list[Finding], Sequence[Any]]:
    turns = trace.get("turns", _MISSING)
    findings: list[Finding] = []
    claimed_by_turn: dict[int, set[tuple[str, ...]]] = {}
    if isinstance(turns, list):
        for i, turn in enumerate(turns):
            if isinstance(turn, Mapping):
                turn_findings, claimed_by_turn[i] = _turn_rules(turn, f"turns[{i}].", typed=False)
                findings += turn_findings
    else:
        turns = []
    for error in errors:
        loc = error["loc"]
        if loc and loc[0] == "schema_version":
            continue  # reported as unknown_schema_version
        if len(loc) >= 2 and loc[0] == "turns" and isinstance(loc[1], int):
            findings += _structural(
                [{**error, "loc": loc[2:]}],
                "malformed_turn",
                f"turns[{loc[1]}].",
                claimed_by_turn.get(loc[1], set()),
            )
        else:
            findings += _structural([error], "malformed_trace", "", set())
    return findings, turns


def _trace_rules(trace: Any, turns: Sequence[Any]) -> list[Finding]:
    findings: list[Finding] = []
    version = _get(trace, "schema_version", SCHEMA_VERSION)
    if type(version) is not int or version != SCHEMA_VERSION:
        findings.append(
            _fatal(
                "unknown_schema_version",
                f"schema_version {version!r} is not {SCHEMA_VERSION}",
                "schema_version",
            )
        )
    seen: dict[str, int] = {}
    for i, turn in enumerate(turns):
        node_id = _get(turn, "node_id", None)
        if not isinstance(node_id, str):
            continue
        if node_id in seen:
            findings.append(
                _fatal(
                    "duplicate_node_id",
                    f"node_id {node_id!r} is already used by turns[{seen[node_id]}]",
                    f"turns[{i}].node_id",
                )
            )
        else:
            seen[node_id] = i
    if not turns:
        findings.append(_warn("empty_trace", "the trace has no model calls", "turns"))
    purpose = _get(trace, "purpose", "train")
    if purpose == "train" and _get(trace, "multi_step_task", False) is True and len(turns) == 1:
        findings.append(
            _fatal(
                "degenerate_rollout",
                "a training capture of a multi-step task holds a single model call",
                "turns",
            )
        )
    return findings


def _graph_findings(graph: RolloutGraph) -> list[Finding]:
    findings: list[Finding] = []
    agent_roots = [r for r in graph.roots if graph.nodes[r].role == "agent"]
    if len(agent_roots) > 1:
        findings.append(
            _warn(
                "multiple_roots",
                f"{len(agent_roots)} roots (rewritten or compacted history): {', '.join(agent_roots[:5])}",
                "turns",
            )
        )
    discarded = [n for n in graph.nodes.values() if n.role == "discarded"]
    if discarded:
        where = ", ".join(f"turns[{n.index}]" for n in discarded[:5])
        findings.append(
            _warn("discarded_turns", f"{len(discarded)} retried call(s) discarded: {where}", "turns")
        )
    auxiliary = [n for n in graph.nodes.values() if n.role == "auxiliary"]
    if auxiliary:
        where = ", ".join(f"turns[{n.index}]" for n in auxiliary[:5])
        findings.append(
            Finding(
                severity=Severity.INFO,
                code="auxiliary_turns",
                message=f"{len(auxiliary)} tool-less side call(s) kept as context only: {where}",
                location="turns",
            )
        )
    return findings


# ---------------------------------------------------------------------------------------------------
# Helpers


def _structural(
    errors: Sequence[Mapping[str, Any]], code: str, prefix: str, claimed: set[tuple[str, ...]]
) -> list[Finding]:
    """The strict model's complaints that no specific rule covered, as `code` findings."""
    findings = []
    for error in errors:
        loc = error["loc"]
        if any(tuple(loc[: len(path)]) == path for path in claimed):
            continue
        where = prefix + _format_loc(loc) if loc else prefix.rstrip(".")
        findings.append(_fatal(code, f"{error['msg']} (got {_short(error.get('input'))})", where))
    return findings


def _format_loc(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get(obj: Any, name: str, default: Any = _MISSING) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _fatal(code: str, message: str, location: str) -> Finding:
    return Finding(severity=Severity.FATAL, code=code, message=message, location=location)


def _warn(code: str, message: str, location: str) -> Finding:
    return Finding(severity=Severity.WARN, code=code, message=message, location=location)
