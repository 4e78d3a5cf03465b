"""The data that crosses package boundaries: captured turns, traces, and capture sessions.

Every other package (server, harnesses, trainer, inspector) reads these models; nothing else defines
its own copy. Models are strict (no coercion) and forbid unknown fields, so a trace that round-trips
through JSON comes back identical or not at all.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1

Purpose = Literal["train", "eval"]
"""train: the policy's own sampling is enforced and turns are trainable. eval: the agent's sampling passes through."""

TurnRole = Literal["agent", "auxiliary", "discarded"]
"""Where a turn sits in the rollout graph (docs/design.md 3.2). Only `agent` turns can be trained on."""

CaptureStatus = Literal["ok", "missing_token_ids", "missing_logprobs", "token_mismatch", "transport_error"]
"""Whether the engine's own tokens and logprobs were captured intact for a turn."""

SessionStatus = Literal["running", "completed", "failed", "timed_out", "cancelled"]

HeaderName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")]
"""An HTTP header's name, as an engine credential's `auth_header` gives it (e.g. `x-api-key`)."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


INT64_LIMIT = 2**63


def require_int64(value: Any, where: str) -> None:
    """Raise ValueError naming the place of any integer in `value` (nested dicts and lists too) that a
    64-bit store column or JSON field cannot hold, so it is refused as bad input rather than failing
    in the store."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not -INT64_LIMIT <= value < INT64_LIMIT:
            raise ValueError(f"{where}: integer {value} does not fit in 64 bits")
    elif isinstance(value, dict):
        for key, item in value.items():
            require_int64(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            require_int64(item, f"{where}[{i}]")


NEUTRAL_SAMPLING: dict[str, float] = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""The values that leave the distribution untouched (OpenEnv's `NON_POLICY_SAMPLING`,
`openenv/core/harness/capture/upstream.py`); top_k 0 also disables top-k, as in vLLM."""


def is_neutral(name: str, value: Any) -> bool:
    """Whether sampling field `name` at `value` leaves the policy's distribution untouched."""
    return value == NEUTRAL_SAMPLING[name] or (name == "top_k" and value == 0)


MIN_TRAIN_TEMPERATURE = 0.01
"""vLLM raises any temperature in (0, 0.01) to 0.01 (`_MAX_TEMP`, vllm/sampling_params.py), and so does the
embedded engine: a train session below it would re-score at a temperature the engine did not use."""


class SamplingParams(_Strict):
    """Sampling settings a session applies to its model calls.

    Takes the full policy OpenEnv's `training_sampling` returns (TRL's rollout loop passes it as is);
    for train sessions everything but the temperature must be neutral (`require_neutral`), because
    processed logprobs after truncation or penalties would bias the importance ratio.
    """

    temperature: float = 1.0
    """Policy temperature. In train sessions it overrides whatever the agent asks for."""
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None
    """Cap on completion tokens per call; None leaves the agent's own value (or the engine default)."""
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """Chat-template arguments sent with every chat call of a train session (vLLM's field, e.g.
    `{"enable_thinking": false}`), over the agent's own."""

    def require_neutral(self) -> None:
        """Raise ValueError naming the first field a training policy may not set (and its neutral value)."""
        if not 0 < self.temperature < float("inf"):
            raise ValueError(f"training sampling needs a finite positive temperature, got {self.temperature}")
        if self.temperature < MIN_TRAIN_TEMPERATURE:
            raise ValueError(
                f"training sampling needs a temperature of at least {MIN_TRAIN_TEMPERATURE}, got "
                f"{self.temperature}: vLLM samples (and reports logprobs) at {MIN_TRAIN_TEMPERATURE} below it, "
                "so the trainer's logprobs at the asked temperature would not be the engine's"
            )
        for name, neutral in NEUTRAL_SAMPLING.items():
            value = getattr(self, name)
            if not is_neutral(name, value):
                raise ValueError(
                    f"training sampling requires {name}={neutral} (got {value}): the policy samples from its "
                    "full distribution, so the engine's logprobs are the ones the trainer recomputes"
                )


class TurnMetadata(BaseModel):
    """How a turn was produced: what a practitioner needs to trust (or debug) its tokens.

    Other keys are kept as they are: OpenEnv's turn metadata is a free dict (its `from_entries` keeps
    the entry's `node_id` there, for one), and a trace read from OpenEnv must come back out unchanged.
    """

    model_config = ConfigDict(strict=True, extra="allow")

    endpoint: Literal["chat", "completions"] = "chat"
    sampling: dict[str, Any] = Field(default_factory=dict)
    """The sampling parameters actually sent upstream."""
    policy_version: int | None = None
    """Weight version the engine reported when it sampled this turn."""
    finish_reason: str | None = None
    latency_s: float | None = None
    parent_node_id: str | None = None
    """Filled when the rollout graph is built (docs/design.md 3.2)."""
    role: TurnRole = "agent"
    capture: CaptureStatus = "ok"
    error: str | None = None
    """Why the capture is not `ok` (mismatch detail, upstream error)."""
    streamed: bool = False
    created_at: float = 0.0
    """Unix time when the response was sent to the agent."""


class TrainingTurn(_Strict):
    """One model call as the engine saw it. The loss mask covers prompt + completion tokens."""

    node_id: str = Field(min_length=1)
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    per_token_logps: list[float]
    """The engine's sampled logprob of each completion token (processed: after temperature)."""
    loss_mask: list[int]
    """One 0/1 per prompt + completion token; 1 marks a token the policy is trained on."""
    request: dict[str, Any] = Field(default_factory=dict)
    """The request as the agent sent it (messages, tools, ...)."""
    response: dict[str, Any] = Field(default_factory=dict)
    """The response as the agent received it."""
    metadata: TurnMetadata = Field(default_factory=TurnMetadata)

    @property
    def trainable(self) -> bool:
        return any(self.loss_mask)


class TrainingTrace(_Strict):
    """All model calls of one rollout, in the order they were made, plus rollout-level facts.

    It reads and writes OpenEnv's `TrainingTrace` JSON (`openenv/core/harness/training.py`, openenv
    0.10.0: `{schema_version, turns: [{node_id, prompt_token_ids, completion_token_ids,
    per_token_logps, loss_mask, request, response, metadata}]}`): every rollout-level field here is
    optional, `to_openenv()` drops them for OpenEnv's strict model, and `to_trace_entries()` /
    `from_entries()` are OpenEnv's (and TRL's) per-turn records.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    session_id: str | None = None
    """The capture session the turns came from; None for a trace that did not come from our store."""
    purpose: Purpose = "train"
    turns: list[TrainingTurn]
    multi_step_task: bool = False
    """The task needs more than one model call; a training capture with a single call is degenerate."""
    status: SessionStatus = "completed"
    model: str | None = None
    task_id: str | None = None
    harness: str | None = None
    sandbox: str | None = None
    reward: float | None = None
    """The rollout's reward; None means unscoreable (never read it as 0)."""
    rewards: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_trace_entries(self) -> list[dict[str, Any]]:
        """One record per turn, as OpenEnv's `to_trace_entries` and TRL's `TraceEntry`: every turn field
        but `node_id`, which moves into `metadata`."""
        return [
            {
                **turn.model_dump(mode="json", exclude={"node_id"}),
                "metadata": {**turn.metadata.model_dump(mode="json"), "node_id": turn.node_id},
            }
            for turn in self.turns
        ]

    @classmethod
    def from_entries(cls, entries: list[dict[str, Any]], **trace_fields: Any) -> TrainingTrace:
        """The inverse of `to_trace_entries`, as OpenEnv's: tokens and masks are taken as they are, never
        inferred; `trace_fields` sets rollout-level fields (`session_id`, `purpose`, ...)."""
        turns = [
            TrainingTurn(
                node_id=entry["metadata"]["node_id"],
                prompt_token_ids=entry["prompt_token_ids"],
                completion_token_ids=entry["completion_token_ids"],
                per_token_logps=entry["per_token_logps"],
                loss_mask=entry["loss_mask"],
                request=entry.get("request", {}),
                response=entry.get("response", {}),
                metadata=TurnMetadata.model_validate(entry.get("metadata", {})),
            )
            for entry in entries
        ]
        return cls(turns=turns, **trace_fields)

    def to_openenv(self) -> dict[str, Any]:
        """This trace as OpenEnv's strict `TrainingTrace` accepts it: its version and turns only (the
        rollout-level facts have no place there); turn metadata becomes a plain dict."""
        return {
            "schema_version": self.schema_version,
            "turns": [
                {
                    **turn.model_dump(mode="json", exclude={"metadata"}),
                    "metadata": turn.metadata.model_dump(mode="json"),
                }
                for turn in self.turns
            ],
        }


class SessionCreate(_Strict):
    """Body of `POST /sessions` on the proxy's admin API."""

    llm_url: str | None = None
    """The engine's OpenAI base URL, with or without the trailing /v1; None uses the proxy's upstream."""
    model: str = Field(min_length=1)
    api_key: str | None = None
    """Key the proxy sends upstream (never shown to the agent)."""
    auth_header: HeaderName | None = None
    """The header `api_key` goes in (e.g. `x-api-key`), sent as is; None: `Authorization: Bearer`."""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    purpose: Purpose = "train"
    max_model_calls: int = Field(default=0, ge=0)
    """Step budget: past this many calls the agent gets a terminal message. 0 means no limit."""
    multi_step_task: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _storable(self) -> SessionCreate:
        require_int64(self.model_dump(), "session")
        if self.purpose == "train":
            self.sampling.require_neutral()
        return self


class SessionInfo(_Strict):
    """What the admin API reports about a capture session."""

    session_id: str
    status: SessionStatus
    purpose: Purpose
    model: str
    llm_url: str
    max_model_calls: int
    num_turns: int
    created_at: float
    finished_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionCreated(_Strict):
    """Reply to `POST /sessions`: what to hand the agent."""

    session_id: str
    api_key: str
    """The key the agent sends as `Authorization: Bearer`."""
    base_url: str
    """The OpenAI base URL (ending in /v1) the agent talks to."""
