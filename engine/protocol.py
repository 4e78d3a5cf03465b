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

POLICY_VERSION_HEADER = "x-policy-version"
"""Response header with the weight version that sampled the reply (the embedded engine's and the imitation's;
vLLM itself sends none)."""
VLLM_ONLY_FIELDS = frozenset({"return_token_ids", "top_k", "min_p", "repetition_penalty"})
"""Request fields vLLM accepts that OpenAI's API refuses."""
MAX_TOP_LOGPROBS = 20

MIN_TEMPERATURE = 0.01
"""vLLM raises a temperature in (0, 0.01) to 0.01, since below it logits / temperature can overflow to inf
or nan (`_MAX_TEMP` in SamplingParams.__post_init__, vllm/sampling_params.py, 0.32.0); 0 stays greedy."""


def effective_temperature(requested: float) -> float:
    """The temperature vLLM samples (and computes processed logprobs) with for a requested one."""
    return MIN_TEMPERATURE if 0 < requested < MIN_TEMPERATURE else requested


LOGPROB_FLOOR = -9999.0
"""vLLM reports -inf (a filtered token) as -9999.0: JSON has no infinity."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(_Request):
    """The sampling fields chat and completion requests share."""

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


class ChatRequest(SamplingFields):
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: Any = None
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def token_id_string(token_id: int) -> str:
    """How a logprob entry names its token under `--return-tokens-as-token-ids`."""
    return f"token_id:{token_id}"


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
            return token_id_string(token_id)
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
