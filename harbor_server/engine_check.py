"""Start-up probe of the inference engine, so a wrong engine is a clear message, not failed rollouts.

Three questions, each answered by one small request:
1. Is it reachable, and does it serve the model? (`GET /v1/models`)
2. Does it return the engine's token ids and sampled logprobs? (a 1-token chat completion with
   `return_token_ids`, `logprobs`, `top_logprobs: 0`, as the capture proxy sends them)
3. Are the logprobs processed (after temperature), as training needs? No endpoint says so, so the
   probe samples at a very low temperature: processed logprobs of the sampled token are then close to 0,
   raw ones usually are not. Only a warning, because a confident model can blur the difference.
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from harbor_server.models import EngineStatus

PROBE_TEMPERATURE = 0.001
PROCESSED_LOGP_MIN = -0.1
"""At PROBE_TEMPERATURE a processed logprob of the sampled token is above this (probability > 0.9)."""
RAW_LOGP_MAX = -1.5
"""A sampled logprob below this at PROBE_TEMPERATURE is what raw (pre-temperature) logprobs look like."""


async def probe_engine(
    url: str | None, model: str | None, *, api_key: str | None = None, timeout_s: float = 10.0
) -> EngineStatus:
    """Probe the engine at `url` (an OpenAI base URL ending in /v1) for serving `model`."""
    status = EngineStatus(url=url, checked=True)
    if url is None:
        status.warnings.append("no --llm-url given: every rollout request must name its own llm_url")
        return status
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s) as client:
        if not await _check_models(client, url, model, status):
            return status
        if model is None:
            status.warnings.append("no --model given: every rollout request must name its model")
            return status
        await _check_completion(client, url, model, status)
    return status


async def engine_context_length(
    url: str, model: str, *, api_key: str | None = None, timeout_s: float = 5.0
) -> int | None:
    """The engine's context length for `model`: the `max_model_len` that vLLM and `harbor engine` report
    in GET /models. None when the engine reports none (a hosted API). Raises httpx.HTTPError when the
    engine cannot be asked, so a caller caches only real answers."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s) as client:
        response = await client.get("/models")
        response.raise_for_status()
    return model_context_length(response.json(), model)


def model_context_length(payload: Any, model: str) -> int | None:
    """`max_model_len` of `model` in an OpenAI model list (None when absent or not a positive int)."""
    try:
        entries = payload["data"]
    except (KeyError, TypeError):
        return None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


async def _check_models(client: httpx.AsyncClient, url: str, model: str | None, status: EngineStatus) -> bool:
    try:
        response = await client.get("/models")
    except httpx.HTTPError as exc:
        status.errors.append(f"engine at {url} is unreachable ({type(exc).__name__}: {exc}); start it first")
        return False
    status.reachable = True
    if response.status_code != 200:
        status.errors.append(f"GET {url}/models answered {response.status_code}: {response.text[:200]}")
        return False
    try:
        status.models = [str(entry["id"]) for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        status.errors.append(f"GET {url}/models did not return an OpenAI model list: {response.text[:200]}")
        return False
    if model is not None and model not in status.models:
        status.errors.append(f"engine at {url} does not serve model {model!r}; it serves {status.models}")
        return False
    return True


async def _check_completion(client: httpx.AsyncClient, url: str, model: str, status: EngineStatus) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 1,
        "temperature": PROBE_TEMPERATURE,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
    }
    try:
        response = await client.post("/chat/completions", json=body)
    except httpx.HTTPError as exc:
        status.errors.append(f"a 1-token chat completion at {url} failed ({type(exc).__name__}: {exc})")
        return
    if response.status_code != 200:
        status.errors.append(
            f"a 1-token chat completion at {url} answered {response.status_code}: {response.text[:300]}"
        )
        return
    try:
        payload = response.json()
        choice = payload["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        status.errors.append(f"a 1-token chat completion at {url} returned no choices: {response.text[:300]}")
        return
    _check_token_ids(payload, choice, url, status)
    _check_logprobs(choice, url, status)


def _check_token_ids(payload: dict[str, Any], choice: dict[str, Any], url: str, status: EngineStatus) -> None:
    prompt_ids = payload.get("prompt_token_ids") or choice.get("prompt_token_ids")
    token_ids = choice.get("token_ids")
    status.token_ids = bool(prompt_ids) and bool(token_ids)
    if not status.token_ids:
        status.errors.append(
            f"engine at {url} returned no prompt_token_ids/token_ids: it needs vLLM >= 0.10 "
            "(return_token_ids); without them no turn can be trained on"
        )


def _check_logprobs(choice: dict[str, Any], url: str, status: EngineStatus) -> None:
    try:
        logp = choice["logprobs"]["content"][0]["logprob"]
    except (KeyError, IndexError, TypeError):
        status.errors.append(
            f"engine at {url} returned no sampled logprobs for logprobs=true, top_logprobs=0"
        )
        return
    if not isinstance(logp, int | float) or isinstance(logp, bool) or not math.isfinite(logp):
        status.errors.append(f"engine at {url} returned a non-finite or non-numeric logprob {logp!r}")
        return
    status.logprobs = True
    if logp >= PROCESSED_LOGP_MIN:
        status.processed_logprobs = True
    elif logp <= RAW_LOGP_MAX:
        status.processed_logprobs = False
        status.warnings.append(
            f"at temperature {PROBE_TEMPERATURE} the sampled token's logprob was {logp:.3f}: the engine "
            "looks like it reports raw logprobs; start vLLM with --logprobs-mode processed_logprobs"
        )
    else:
        status.warnings.append(
            f"cannot tell whether the engine's logprobs are processed (probe logprob {logp:.3f}); "
            "make sure vLLM runs with --logprobs-mode processed_logprobs"
        )
