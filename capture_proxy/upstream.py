"""The vLLM dialect: check what an agent sent, rewrite it for the engine, read the engine's tokens back.

Everything here is plain functions over dicts (no pydantic on the hot path): the proxy touches each
request once on the way in and each response once on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

from capture_proxy.errors import ProxyRequestError
from capture_proxy.store.codec import PackedIds, checked_ids

Endpoint = Literal["chat", "completions"]

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "max_tokens",
    "max_completion_tokens",
    "seed",
)
"""The request fields recorded as the sampling a turn was produced with."""

EVAL_OVERRIDES = ("temperature", "top_p", "top_k", "min_p")
"""Sampling an eval session's creator may set over the agent's (`max_tokens` is a cap in every session)."""

_TOKEN_ID_PREFIX = "token_id:"


@dataclass(slots=True)
class Wants:
    """Which engine-only fields the agent itself asked for (everything else is stripped from its reply)."""

    logprobs: bool = False
    token_ids: bool = False


@dataclass(slots=True)
class Capture:
    """What the engine reported about one completion."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logps: list[float]
    status: str = "ok"
    error: str | None = None
    finish_reason: str | None = None


def bad_request(message: str, param: str | None = None, status: int = 400) -> ProxyRequestError:
    return ProxyRequestError(status, message, param=param, code="invalid_request")


# -- validation of what the agent sent -------------------------------------------------------------


def _check_number(body: dict, key: str) -> None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
        raise bad_request(f"'{key}' must be a number, got {type(v).__name__}", key)


def _check_int(body: dict, key: str, bounds: tuple[int, int] | None = None) -> None:
    v = body.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{key}' must be an integer, got {type(v).__name__}", key)
    if bounds is not None and not bounds[0] <= v <= bounds[1]:
        raise bad_request(f"'{key}' must be between {bounds[0]} and {bounds[1]}, got {v}", key)


MAX_TOKEN_ID = 2**31 - 1
"""The largest token id the store keeps (int32, store/codec.py); no vocabulary comes near. An engine
echoes a prompt's ids back, so a larger one would be answered and then fail to be stored."""

MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on `top_logprobs`, and vLLM's default `max_logprobs`: the engine answers each token
with this many alternatives, so a huge one would hold it for as long as it takes to list them."""


def _check_str(m: dict, key: str, where: str) -> None:
    v = m.get(key)
    if v is not None and not isinstance(v, str):
        raise bad_request(f"{where}.{key} must be a string, got {type(v).__name__}", f"{where}.{key}")


def _check_parts(parts: list, where: str) -> None:
    """Content parts: objects with a string `type`; a text part's `text` is a string (the template
    joins them)."""
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"{where}[{j}] must be an object with a string 'type'", f"{where}[{j}]")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}].text must be a string", f"{where}[{j}].text")


_MESSAGE_STR_KEYS = ("name", "tool_call_id", "reasoning_content")


def _check_message(m: dict, i: int) -> None:
    """The message fields a chat template reads: a malformed one is the agent's error (400), not a
    request that crashes the engine and makes the whole rollout unscoreable. Runs for every message of
    every call (an agent's history is hundreds of them), so the checks are inline and an error's text
    is only built when there is one."""
    get = m.get
    content = get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            raise bad_request(
                f"messages[{i}].content must be a string, an array of parts or null", f"messages[{i}]"
            )
        _check_parts(content, f"messages[{i}].content")
    for key in _MESSAGE_STR_KEYS:
        v = get(key)
        if v is not None and not isinstance(v, str):
            _check_str(m, key, f"messages[{i}]")
    calls = get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be an array", f"messages[{i}]")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(
                f"messages[{i}].tool_calls[{j}] must have a 'function' with a string 'name'", f"messages[{i}]"
            )
        # Arguments that are not valid JSON are kept: models write them, and the agent replays them.
        arguments = fn.get("arguments")
        if arguments is not None and not isinstance(arguments, str) and not isinstance(arguments, dict):
            raise bad_request(
                f"messages[{i}].tool_calls[{j}].function.arguments must be a string", f"messages[{i}]"
            )


def _check_tool(tool: Any, i: int) -> None:
    """A function tool: its name, and the parts of its JSON schema the chat template and the tool parser
    read (`properties`, each an object or a boolean schema, and `required`, names)."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(
            f"tools[{i}] must be an object with a 'function' that has a string 'name'", f"tools[{i}]"
        )
    where = f"tools[{i}].function"
    _check_str(fn, "description", where)
    schema = fn.get("parameters")
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise bad_request(f"{where}.parameters must be an object", f"{where}.parameters")
    properties = schema.get("properties")
    if properties is not None and not (
        isinstance(properties, dict) and all(isinstance(p, dict | bool) for p in properties.values())
    ):
        raise bad_request(
            f"{where}.parameters.properties must be an object of schemas", f"{where}.parameters.properties"
        )
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        raise bad_request(
            f"{where}.parameters.required must be an array of strings", f"{where}.parameters.required"
        )


def _check_tool_choice(choice: Any) -> None:
    if choice is None or choice in ("none", "auto", "required"):
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
        raise bad_request(
            "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
            '{"name": ...}}',
            "tool_choice",
        )


def validate_request(body: Any, endpoint: Endpoint) -> None:
    """Reject what no engine could answer, naming the field; cheap checks only, the engine does the rest."""
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is None:
        raise bad_request("missing required field 'model'", "model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string", "model")
    if endpoint == "chat":
        messages = body.get("messages")
        if messages is None:
            raise bad_request("missing required field 'messages'", "messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty array of message objects", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
            _check_message(m, i)
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad_request("'tools' must be an array", "tools")
        for i, tool in enumerate(tools or ()):
            _check_tool(tool, i)
        _check_tool_choice(body.get("tool_choice"))
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise bad_request("'logprobs' must be a boolean", "logprobs")
        _check_int(body, "top_logprobs", (0, MAX_TOP_LOGPROBS))
        ctk = body.get("chat_template_kwargs")
        if ctk is not None and not isinstance(ctk, dict):
            raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise bad_request("missing required field 'prompt'", "prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) > 0)):
            raise bad_request("'prompt' must be a string or a non-empty array", "prompt")
        if isinstance(prompt, list) and len(prompt) > 1 and not all(isinstance(t, int) for t in prompt):
            raise bad_request(
                "the capture proxy takes one prompt per request (a string or token ids)", "prompt"
            )
        if isinstance(prompt, list) and not (
            (len(prompt) == 1 and isinstance(prompt[0], str))
            or all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in prompt)
        ):
            raise bad_request(
                f"'prompt' as an array must hold one string or token ids (integers from 0 to {MAX_TOKEN_ID})",
                "prompt",
            )
        _check_int(body, "logprobs")
    for key in ("stream", "return_token_ids"):
        flag = body.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise bad_request(f"'{key}' must be a boolean", key)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad_request("'stop' must be a string or an array of strings", "stop")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("the capture proxy records one completion per call: 'n' must be 1", "n")
    for key in (
        "temperature",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ):
        _check_number(body, key)
    for key in ("max_tokens", "max_completion_tokens", "top_k", "seed"):
        _check_int(body, key)


# -- rewriting for the engine --------------------------------------------------------------------


def rewrite_request(
    body: dict, *, endpoint: Endpoint, model: str, purpose: str, sampling: dict, replay_stream: bool = False
) -> tuple[dict, dict, Wants]:
    """The body sent upstream, the sampling it carries, and which engine-only fields the agent asked for.
    With `replay_stream` a streamed call goes upstream unstreamed (ProxyConfig.stream_mode "replay").

    Train sessions get the session's own sampling (the importance ratio needs the policy's processed
    logprobs, untouched by the agent's truncation or penalties). Eval sessions keep the agent's, except
    the fields their creator set (`harbor eval --temperature/--max-tokens`): an eval session's
    `sampling` holds only those (see `CaptureService.create_session`).
    """
    up = dict(body)
    up["model"] = model
    wants = Wants(token_ids=bool(body.get("return_token_ids")))
    if endpoint == "chat":
        wants.logprobs = bool(body.get("logprobs"))
        up["logprobs"] = True
        # vLLM returns no logprobs at all without top_logprobs; 0 asks for the sampled token's only.
        up["top_logprobs"] = (body.get("top_logprobs") or 0) if wants.logprobs else 0
    else:
        wants.logprobs = body.get("logprobs") is not None
        up["logprobs"] = body.get("logprobs") or 0
    up["return_token_ids"] = True
    if replay_stream and up.get("stream"):
        up["stream"] = False
        up.pop("stream_options", None)  # vLLM refuses stream_options on an unstreamed call (400)
    if purpose == "train":
        up["temperature"] = sampling.get("temperature", 1.0)
        up["top_p"] = sampling.get("top_p", 1.0)
        up["top_k"] = sampling.get("top_k", -1)
        up["min_p"] = sampling.get("min_p", 0.0)
        up["presence_penalty"] = 0.0
        up["frequency_penalty"] = 0.0
        up["repetition_penalty"] = 1.0
        up.pop("logit_bias", None)
        if sampling.get("seed") is not None:
            up["seed"] = sampling["seed"]
        if endpoint == "chat" and sampling.get("chat_template_kwargs"):
            up["chat_template_kwargs"] = {
                **(body.get("chat_template_kwargs") or {}),
                **sampling["chat_template_kwargs"],
            }
    else:
        # Not the seed: clients seed every session, and an eval samples as the agent asks unless told.
        up.update({k: sampling[k] for k in EVAL_OVERRIDES if sampling.get(k) is not None})
    cap = sampling.get("max_tokens")
    if cap is not None:
        asked = [up[k] for k in ("max_tokens", "max_completion_tokens") if up.get(k) is not None]
        up.pop("max_completion_tokens", None)
        up["max_tokens"] = min([cap, *asked])
    sent = {k: up[k] for k in SAMPLING_KEYS if up.get(k) is not None}
    return up, sent, wants


# -- reading the engine's answer -----------------------------------------------------------------


def check_tokens(
    prompt_ids: list[int] | None,
    completion_ids: list[int] | None,
    tokens: list[str] | None,
    logps: list[Any] | None,
) -> tuple[str, str | None]:
    """Capture status and error of one completion: ids present, one logprob per id, `token_id:N` == ids[i].

    Raises TypeError when the engine sent values of the wrong type (a malformed reply, not a capture)."""
    _require_types(prompt_ids, completion_ids, logps)
    if prompt_ids is None or completion_ids is None:
        which = "prompt_token_ids" if prompt_ids is None else "token_ids"
        return (
            "missing_token_ids",
            f"engine returned no {which} (is it vLLM >= 0.10.2 with return_token_ids?)",
        )
    if logps is None:
        return "missing_logprobs", "engine returned no logprobs"
    if len(logps) != len(completion_ids):
        return "token_mismatch", f"engine returned {len(logps)} logprobs for {len(completion_ids)} token ids"
    if None in logps:
        return "missing_logprobs", "engine returned a null logprob"
    if tokens:
        # The common case in one comparison: every token reads `token_id:N` and matches.
        if tokens == [_TOKEN_ID_PREFIX + str(tid) for tid in completion_ids]:
            return "ok", None
        for i, (tok, tid) in enumerate(zip(tokens, completion_ids, strict=False)):
            if tok.startswith(_TOKEN_ID_PREFIX) and tok[9:] != str(tid):
                return "token_mismatch", f"logprob token {i} reads {tok!r} but token_ids[{i}] is {tid}"
    return "ok", None


_NUMBER_TYPES = {int, float, type(None)}


def token_ids(ids: Any, name: str) -> list[int] | None:
    """The engine's ids checked as a list of ints (TypeError otherwise), carrying their stored int32
    encoding (codec.PackedIds): packing them is the check, done once per reply."""
    if ids is None or type(ids) is PackedIds:
        return ids
    if type(ids) is not list:
        raise TypeError(f"engine sent {name} that are not a list of integers: {str(ids)[:200]}")
    try:
        return checked_ids(ids)
    except TypeError:
        raise TypeError(f"engine sent {name} that are not a list of integers: {str(ids)[:200]}") from None


def _require_types(prompt_ids: Any, completion_ids: Any, logps: Any) -> None:
    """The engine's ids are lists of ints and its logprobs numbers (or null): anything else cannot be
    stored or trained on, so the reply is malformed. One set of types per list keeps this cheap."""
    token_ids(prompt_ids, "prompt_token_ids")
    token_ids(completion_ids, "token_ids")
    if logps is not None and not {*map(type, logps)} <= _NUMBER_TYPES:
        raise TypeError(f"engine sent logprobs that are not numbers: {str(logps)[:200]}")


def _first_choice(resp: dict) -> dict:
    choices = resp["choices"]
    if type(choices) is not list or not choices or not all(type(c) is dict for c in choices):
        raise TypeError(f"engine sent choices that are not a list of objects: {str(choices)[:200]}")
    return choices[0]


_TOKEN = itemgetter("token")
_LOGPROB = itemgetter("logprob")


def _checked_in_place(obj: dict, key: str) -> list[int] | None:
    """obj[key] as checked token ids, put back in its place: the store then knows the reply's ids are
    the capture's own (compact.py), and packs them once."""
    ids = token_ids(obj.get(key), key)
    if ids is not None:
        obj[key] = ids
    return ids


def capture_chat(resp: dict) -> Capture:
    """Tokens and logprobs of a non-streamed chat completion (vLLM: top-level prompt ids, per-choice ids)."""
    choice = _first_choice(resp)
    prompt = _checked_in_place(resp, "prompt_token_ids")
    comp = _checked_in_place(choice, "token_ids")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    tokens = logps = None
    if content is not None:
        tokens = list(map(_TOKEN, content))
        logps = list(map(_LOGPROB, content))
    status, error = check_tokens(prompt, comp, tokens, logps)
    return Capture(prompt or [], comp or [], logps or [], status, error, choice.get("finish_reason"))


def capture_completion(resp: dict) -> Capture:
    """Tokens and logprobs of a non-streamed text completion (vLLM: prompt ids per choice)."""
    choice = _first_choice(resp)
    prompt = _checked_in_place(choice, "prompt_token_ids")
    comp = _checked_in_place(choice, "token_ids")
    lp = choice.get("logprobs")
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    logps = lp.get("token_logprobs") if isinstance(lp, dict) else None
    status, error = check_tokens(prompt, comp, tokens, logps)
    return Capture(prompt or [], comp or [], logps or [], status, error, choice.get("finish_reason"))


def strip_for_agent(resp: dict, wants: Wants) -> bool:
    """Remove, in place, the engine-only fields the proxy asked for and the agent did not; whether
    anything changed (when nothing did, the engine's own bytes can be relayed as they came)."""
    changed = False
    if not wants.token_ids and "prompt_token_ids" in resp:
        del resp["prompt_token_ids"]
        changed = True
    for choice in resp.get("choices") or ():
        if not wants.token_ids:
            for key in ("token_ids", "prompt_token_ids"):
                if key in choice:
                    del choice[key]
                    changed = True
        if not wants.logprobs and choice.get("logprobs") is not None:
            choice["logprobs"] = None
            changed = True
    return changed
