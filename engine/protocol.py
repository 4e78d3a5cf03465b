"""vLLM's OpenAI dialect: request models, their validation into sampling settings, and response bodies.

Shapes follow vLLM's `protocol.py`: chat responses carry top-level `prompt_token_ids` and per-choice
`token_ids` when `return_token_ids` is set; completion choices carry both per choice; stream chunks
carry each step's `token_ids`; logprob tokens read `token_id:N` when the server runs with
`--return-tokens-as-token-ids`; errors are `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import BadRequest
from engine.sampling import SamplingSettings

MAX_TOP_LOGPROBS = 20
LOGPROB_FLOOR = -9999.0
"""vLLM reports -inf (a filtered token) as -9999.0: JSON has no infinity."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(_Request):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    return_token_ids: bool | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0


class ChatRequest(_Sampling):
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False


class Defaults(BaseModel):
    """Sampling defaults taken from the model folder's generation_config.json, as vLLM does."""

    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


def _check_range(value: float | int | None, name: str, ok: bool, rule: str) -> None:
    if value is not None and not ok:
        raise BadRequest(f"{name} must be {rule}, got {value}.", param=name)


def sampling_settings(
    req: _Sampling,
    *,
    prompt_len: int,
    max_model_len: int,
    defaults: Defaults,
    max_tokens: int | None,
    num_logprobs: int | None,
) -> SamplingSettings:
    """Validate a request's sampling fields and resolve defaults and the token budget."""
    _check_range(req.n, "n", req.n >= 1, "at least 1")
    _check_range(max_tokens, "max_tokens", max_tokens is None or max_tokens >= 1, "at least 1")
    _check_range(
        req.temperature, "temperature", req.temperature is None or req.temperature >= 0, "non-negative"
    )
    _check_range(req.top_p, "top_p", req.top_p is None or 0 < req.top_p <= 1, "in (0, 1]")
    _check_range(
        req.top_k, "top_k", req.top_k is None or req.top_k >= -1, "-1 (disable), 0 (disable) or at least 1"
    )
    _check_range(req.min_p, "min_p", req.min_p is None or 0 <= req.min_p <= 1, "in [0, 1]")
    if num_logprobs is not None and not 0 <= num_logprobs <= MAX_TOP_LOGPROBS:
        raise BadRequest(
            f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {num_logprobs}.", param="logprobs"
        )
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        value = getattr(req, name)
        if value is not None and value != neutral:
            raise BadRequest(
                f"{name}={value} is not supported by the embedded engine (use {neutral}).", param=name
            )
    if prompt_len >= max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )
    room = max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = min(room, defaults.max_new_tokens) if defaults.max_new_tokens else room
    elif max_tokens > room:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{max_tokens + prompt_len} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
            param="max_tokens",
        )
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingSettings(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        min_p=req.min_p or 0.0,
        max_tokens=max_tokens,
        stop=[s for s in stop if s],
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        seed=req.seed,
        logprobs=num_logprobs,
    )


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def clamp(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


class TokenNamer:
    """How a token id is shown in logprobs: its text, or `token_id:N` when the server says so."""

    def __init__(self, tokenizer: Any, as_token_ids: bool) -> None:
        self.tokenizer = tokenizer
        self.as_token_ids = as_token_ids

    def __call__(self, token_id: int) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id])

    def chat_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
        token = self(token_id)
        return {
            "token": token,
            "logprob": clamp(logprob),
            "bytes": list(token.encode("utf-8", errors="replace")),
            "top_logprobs": [
                {
                    "token": (t := self(i)),
                    "logprob": clamp(lp),
                    "bytes": list(t.encode("utf-8", errors="replace")),
                }
                for i, lp in top
            ],
        }

    def completion_logprobs(
        self, steps: list[tuple[int, float, list[tuple[int, float]]]], offset: int
    ) -> dict[str, Any]:
        """vLLM's CompletionLogProbs for a run of sampled tokens starting at text offset `offset`."""
        out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for token_id, logprob, top in steps:
            token = self(token_id)
            out["text_offset"].append(offset)
            out["token_logprobs"].append(clamp(logprob))
            out["tokens"].append(token)
            alternatives = {self(i): clamp(lp) for i, lp in top}
            alternatives.setdefault(token, clamp(logprob))
            out["top_logprobs"].append(alternatives)
            offset += len(self.tokenizer.decode([token_id], skip_special_tokens=True))
        return out


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "vllm"
    root: str
    parent: str | None = None
    max_model_len: int
    permission: list[dict[str, Any]] = Field(default_factory=list)
