"""Start-up probe of the inference engine, so a wrong engine is a clear message, not failed rollouts.

Three questions, each answered by one small request:
1. Is it reachable, and does it serve the model? (`GET /v1/models`)
2. Does it return the engine's token ids and sampled logprobs? (a 1-token chat completion with
   `return_token_ids`, `logprobs`, `top_logprobs: 0`, as the capture proxy sends them)
3. Are the logprobs processed (after temperature), as training needs? No endpoint says so, so the
   probe asks for the first token's top alternatives at two temperatures: processed logprobs are
   `log_softmax(logits / T)`, so the gap between two alternatives doubles from T=1 to T=0.5, while raw
   ones do not move. A ratio, not a threshold on one logprob: it holds for a confident model and a
   random one alike, and for vLLM, which raises any temperature below 0.01 to 0.01 (so a probe at a
   tiny temperature could not tell). Only a warning when unclear (an engine without top_logprobs).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from harbor_server.models import EngineStatus

PROBE_TEMPERATURES = (1.0, 0.5)
"""The two temperatures of the processed-logprobs check: processed gaps grow by 1.0 / 0.5 = 2."""
PROBE_ALTERNATIVES = 20
"""top_logprobs asked for in that check (vLLM's default most): the widest spread of alternatives."""
MIN_GAP = 0.005
"""Below this gap (at T=1) between the most and least likely shared alternative the ratio says nothing.
A random model's are close (the tiny model's top 20 span ~0.1 nats) but float32 logprobs are exact to
~1e-6, so the ratio is still exact to a few parts in 1e4."""
RATIO_TOLERANCE = 0.1
"""How far (relative) the measured gap ratio may be from 2 (processed) or 1 (raw) for a verdict."""


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


async def _chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], status: EngineStatus
) -> dict[str, Any] | None:
    """POST a 1-token chat completion; its payload, or None with an error recorded."""
    try:
        response = await client.post("/chat/completions", json=body)
    except httpx.HTTPError as exc:
        status.errors.append(f"a 1-token chat completion at {url} failed ({type(exc).__name__}: {exc})")
        return None
    if response.status_code != 200:
        status.errors.append(
            f"a 1-token chat completion at {url} answered {response.status_code}: {response.text[:300]}"
        )
        return None
    try:
        payload = response.json()
        if not isinstance(payload["choices"][0], dict):
            raise TypeError("a choice is not an object")
    except (ValueError, KeyError, IndexError, TypeError):
        status.errors.append(f"a 1-token chat completion at {url} returned no choices: {response.text[:300]}")
        return None
    return payload


def _probe_body(model: str, temperature: float, top_logprobs: int) -> dict[str, Any]:
    return {
        "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
        "temperature": temperature, "logprobs": True, "top_logprobs": top_logprobs, "return_token_ids": True,
        "seed": 0,
    }  # fmt: skip


async def _check_completion(client: httpx.AsyncClient, url: str, model: str, status: EngineStatus) -> None:
    # As the capture proxy asks: the sampled token's logprob only (top_logprobs 0), and the token ids.
    payload = await _chat(client, url, _probe_body(model, PROBE_TEMPERATURES[0], 0), status)
    if payload is None:
        return
    choice = payload["choices"][0]
    _check_token_ids(payload, choice, url, status)
    _check_logprobs(choice, url, status)
    if not status.logprobs:
        return
    tops = []
    for temperature in PROBE_TEMPERATURES:
        errors = len(status.errors)
        payload = await _chat(client, url, _probe_body(model, temperature, PROBE_ALTERNATIVES), status)
        if payload is None:  # an engine without top_logprobs still serves training: a warning, not an error
            status.warnings.extend(status.errors[errors:])
            del status.errors[errors:]
            break
        tops.append(_top_logprobs(payload["choices"][0]))
    _judge_processed(tops, url, status)


def _top_logprobs(choice: dict[str, Any]) -> dict[str, float]:
    try:
        entries = choice["logprobs"]["content"][0]["top_logprobs"]
        return {str(e["token"]): float(e["logprob"]) for e in entries if math.isfinite(float(e["logprob"]))}
    except (KeyError, IndexError, TypeError, ValueError):
        return {}


def _judge_processed(tops: list[dict[str, float]], url: str, status: EngineStatus) -> None:
    """Set `status.processed_logprobs` from the gap ratio of alternatives both temperatures list."""
    unclear = (
        f"cannot tell whether the engine at {url} reports processed logprobs ({{why}}); make sure vLLM runs "
        "with --logprobs-mode processed_logprobs"
    )
    if len(tops) < 2:
        status.warnings.append(unclear.format(why="no top_logprobs at two temperatures"))
        return
    high, low = tops
    shared = [token for token in high if token in low]
    if len(shared) < 2:
        status.warnings.append(unclear.format(why="the two temperatures share fewer than 2 alternatives"))
        return
    first, last = max(shared, key=high.__getitem__), min(shared, key=high.__getitem__)
    gap = high[first] - high[last]
    if gap < MIN_GAP:
        status.warnings.append(unclear.format(why=f"its top alternatives are only {gap:.3f} apart"))
        return
    ratio = (low[first] - low[last]) / gap
    processed = PROBE_TEMPERATURES[0] / PROBE_TEMPERATURES[1]
    if abs(ratio - processed) <= RATIO_TOLERANCE * processed:
        status.processed_logprobs = True
    elif abs(ratio - 1.0) <= RATIO_TOLERANCE:
        status.processed_logprobs = False
        status.warnings.append(
            f"the engine at {url} reports raw logprobs: their gaps did not change from temperature "
            f"{PROBE_TEMPERATURES[0]} to {PROBE_TEMPERATURES[1]} (ratio {ratio:.2f}, processed would be "
            f"{processed:.0f}); start vLLM with --logprobs-mode processed_logprobs"
        )
    else:
        status.warnings.append(unclear.format(why=f"gap ratio {ratio:.2f}, expected {processed:.0f} or 1"))


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
