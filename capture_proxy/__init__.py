"""The capture layer: what a model call looked like to the engine, kept exactly and checked; the data
models every other package shares (traces, findings, training rows, SFT episodes).

    from capture_proxy import TrainingTrace, validate_trace, build_training_rows
    findings = validate_trace(trace)          # FATAL / WARN / INFO findings with stable codes
    rows = build_training_rows(trace)         # merged chains, masks, behaviour logprobs (InvalidTraceError if FATAL)

The proxy itself (`capture_proxy.app.create_app`, `capture_proxy.service.CaptureService`) and the store
(`capture_proxy.store.TraceStore`) are imported from their modules, so reading traces loads no web stack.
"""

from capture_proxy.errors import CaptureError, InvalidTraceError, SessionNotFound, StoreError
from capture_proxy.graph import RolloutGraph, RolloutNode, build_rollout_graph, finalize_trace
from capture_proxy.models import (
    SamplingParams,
    SessionCreate,
    SessionCreated,
    SessionInfo,
    TrainingTrace,
    TrainingTurn,
    TurnMetadata,
)
from capture_proxy.rows import TrainingRow, build_training_rows
from capture_proxy.validation import (
    Finding,
    Severity,
    fatal,
    require_trainable,
    validate_trace,
    validate_turn,
)

__all__ = [
    "CaptureError",
    "Finding",
    "InvalidTraceError",
    "RolloutGraph",
    "RolloutNode",
    "SamplingParams",
    "SessionCreate",
    "SessionCreated",
    "SessionInfo",
    "SessionNotFound",
    "Severity",
    "StoreError",
    "TrainingRow",
    "TrainingTrace",
    "TrainingTurn",
    "TurnMetadata",
    "build_rollout_graph",
    "build_training_rows",
    "fatal",
    "finalize_trace",
    "require_trainable",
    "validate_trace",
    "validate_turn",
]
