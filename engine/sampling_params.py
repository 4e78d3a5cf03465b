"""A request's sampling fields, validated into the scheduler's SamplingSettings: the model folder's
defaults (generation_config.json, as vLLM reads it), vLLM's range checks and the context-length budget,
with vLLM's error messages."""

from __future__ import annotations

from pydantic import BaseModel

from engine.errors import BadRequest
from engine.protocol import MAX_TOP_LOGPROBS, SamplingFields, effective_temperature
from engine.sampling import SamplingSettings


class Defaults(BaseModel):
    """Sampling defaults taken from the model folder's generation_config.json, as vLLM does."""

    max_new_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


def _check_range(value: float | int | None, name: str, ok: bool, rule: str) -> None:
    """vLLM's refusal (vllm/sampling_params.py, _verify_args; its server appends the parameter and value
    where the check names them; tests/vllm_live/test_sampling_points.py compares them)."""
    if value is not None and not ok:
        if name not in _NAMED:
            raise BadRequest(f"{name} must be {rule}, got {value}.", param=None if name == "n" else name)
        raise BadRequest(f"{name} must be {rule}, got {value}. (parameter={name}, value={value})", param=name)


_NAMED = ("temperature", "top_p", "max_tokens")
"""The checks vLLM 0.32 raises with `parameter=` (the others' messages end at the value)."""


def sampling_settings(
    req: SamplingFields,
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
    _check_range(req.temperature, "temperature", req.temperature is None or req.temperature <= 2, "in [0, 2]")
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
        temperature=effective_temperature(
            defaults.temperature if req.temperature is None else req.temperature
        ),
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
