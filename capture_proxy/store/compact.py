"""A turn's request and response stored as what is new in them, read back exactly as they were.

Request: an agent resends its whole conversation on every call, so storing each request in full
costs the square of the rollout's length. A chat request is stored as how many leading messages it
shares with its base turn's request (the turn its prompt ids are stored against, prefix.py: the
session's previous turn, which in a linear rollout is its parent in the graph) plus the messages
after them. Messages are compared by their JSON text, so a shared message reads back as it was sent
(`1`, `1.0` and `true` stay apart, as dict equality would not keep them).

Response: the reply keeps what the row already holds as arrays only when the agent asked for it
(prompt and completion ids; each logprob entry's `token_id:N` token and its logprob). Those are
stored as null, or left out of each logprob entry, with a flag per field in `response_elided`;
reading rebuilds them from the arrays. A field is elided only when rebuilding it gives it back as it
was (same values, same key order), so any other shape is stored as sent.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from enum import IntFlag
from operator import itemgetter
from typing import Any

import orjson

from capture_proxy.store.codec import PackedIds

_TOKEN_ID = "token_id:"


class Elided(IntFlag):
    PROMPT_IDS = 1
    """The top-level `prompt_token_ids` (chat)."""
    COMPLETION_IDS = 2
    """choices[0].token_ids"""
    CHAT_LOGPROBS = 4
    """Each choices[0].logprobs.content entry's leading `token` (`token_id:N`) and `logprob`."""
    TEXT_LOGPROBS = 8
    """choices[0].logprobs.token_logprobs (completions)."""
    TEXT_TOKENS = 16
    """choices[0].logprobs.tokens as `token_id:N` (completions)."""
    CHOICE_PROMPT_IDS = 32
    """choices[0].prompt_token_ids (completions)."""
    CHAT_BYTES = 64
    """With CHAT_LOGPROBS: each entry's `bytes` after them, when every entry's is its token's UTF-8."""


# -- requests ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Messages:
    """A chat request's messages as one JSON array text, and how many there are."""

    text: bytes = b""
    count: int = 0


NO_MESSAGES = Messages()


def messages_of(request: dict) -> Messages:
    """A request's messages (none for a request without a message list)."""
    messages = request.get("messages")
    if type(messages) is not list:
        return NO_MESSAGES
    return Messages(orjson.dumps(messages), len(messages))


def _each(messages: Messages) -> list[bytes]:
    return [orjson.dumps(m) for m in orjson.loads(messages.text)] if messages.count else []


def shared_messages(mine: Messages, base: Messages) -> int:
    """How many leading messages two requests have in common, compared as JSON text.

    Usually all of the base's: then the base's array text without its closing bracket begins ours,
    and a comma or our closing bracket follows it. That is one comparison in C, not one per message:
    a JSON value's text ends exactly where its parse ends, so the elements line up. Otherwise (the
    agent compacted or edited its history) message by message."""
    if not base.count or not mine.count:
        return 0
    end = len(base.text) - 1
    if mine.text[end : end + 1] in (b",", b"]") and mine.text[:end] == base.text[:end]:
        return base.count
    n = 0
    for theirs, ours in zip(_each(base), _each(mine), strict=False):
        if ours != theirs:
            break
        n += 1
    return n


def stored_request(request: dict, shared: int) -> dict:
    """The request as stored: its messages after the first `shared` (which the base turn holds)."""
    if not shared:
        return request
    return {**request, "messages": request["messages"][shared:]}


def rebuild_messages(stored: dict, shared: int, base: Messages) -> None:
    """Put a stored request's whole message list back in place (`shared` > 0). Each turn read back
    gets objects of its own, as a request read from its own JSON did."""
    if base.count < shared or type(stored.get("messages")) is not list:
        raise ValueError(f"the base turn has {base.count} messages; this turn shares {shared}")
    stored["messages"] = orjson.loads(base.text)[:shared] + stored["messages"]


# -- responses --------------------------------------------------------------------------------------


def _same_ids(value: Any, ids: list[int]) -> bool:
    """Whether `value` reads back as `ids` does: the capture's own checked list, or equal JSON."""
    if type(value) is PackedIds and value is ids:
        return True
    return type(value) is list and len(value) == len(ids) and orjson.dumps(value) == orjson.dumps(ids)


def _same_float(value: Any, x: float) -> bool:
    return value is x or (
        type(value) is float and value == x and math.copysign(1.0, value) == math.copysign(1.0, x)
    )


_TOKEN = itemgetter("token")
_LOGPROB = itemgetter("logprob")
_BYTES = itemgetter("bytes")


def _chat_residuals(content: Any, ids: list[int], logps: list[float]) -> tuple[list[dict], bool] | None:
    """Each entry without its leading token and logprob (and `bytes`, when every entry's is its
    token's UTF-8), or None when any entry cannot be rebuilt. Checked a column at a time, in C where
    the checks allow (an entry per completion token)."""
    if type(content) is not list or not content or len(content) != len(ids) or len(logps) != len(ids):
        return None
    if not all(type(entry) is dict for entry in content):
        return None
    shapes = set(map(tuple, content))  # each entry's keys, in order
    if not all(keys[:2] == ("token", "logprob") for keys in shapes):
        return None
    tokens = [f"{_TOKEN_ID}{tid}" for tid in ids]
    if list(map(_TOKEN, content)) != tokens:
        return None
    values = list(map(_LOGPROB, content))
    if not all(map(operator.is_, values, logps)) and not all(map(_same_float, values, logps)):
        return None
    with_bytes = (
        all(keys[2:3] == ("bytes",) for keys in shapes)
        and content[0]["bytes"] == list(tokens[0].encode())  # a mismatch is found before building the rest
        and list(map(_BYTES, content)) == [list(t.encode()) for t in tokens]
    )
    skip = 3 if with_bytes else 2
    # One shape is the usual case: `top_logprobs` is left, and with vLLM `bytes` too (its entry bytes
    # are the decoded token's, not its `token_id:N` string's). A dict literal is ~3x the general path.
    rest = next(iter(shapes))[skip:] if len(shapes) == 1 else ()
    if len(rest) == 1:
        key = rest[0]
        return [{key: value} for value in map(itemgetter(key), content)], with_bytes
    if len(rest) == 2:
        first, second = rest
        return [{first: a, second: b} for a, b in map(itemgetter(first, second), content)], with_bytes
    return [dict(list(entry.items())[skip:]) for entry in content], with_bytes


def elide_response(
    response: dict, prompt: list[int], completion: list[int], logps: list[float]
) -> tuple[dict, int]:
    """The response as stored and its Elided flags; `response` itself is left as it is."""
    choices = response.get("choices")
    choice = choices[0] if type(choices) is list and choices and type(choices[0]) is dict else None
    flags = Elided(0)
    top: dict[str, Any] = {}
    first: dict[str, Any] = {}
    if "prompt_token_ids" in response and prompt and _same_ids(response["prompt_token_ids"], prompt):
        top["prompt_token_ids"] = None
        flags |= Elided.PROMPT_IDS
    if choice is not None:
        if "prompt_token_ids" in choice and prompt and _same_ids(choice["prompt_token_ids"], prompt):
            first["prompt_token_ids"] = None
            flags |= Elided.CHOICE_PROMPT_IDS
        if "token_ids" in choice and completion and _same_ids(choice["token_ids"], completion):
            first["token_ids"] = None
            flags |= Elided.COMPLETION_IDS
        lp = choice.get("logprobs")
        if type(lp) is dict and completion:
            lp_out: dict[str, Any] = {}
            residuals = _chat_residuals(lp.get("content"), completion, logps)
            if residuals is not None:
                lp_out["content"] = residuals[0]
                flags |= Elided.CHAT_LOGPROBS | (Elided.CHAT_BYTES if residuals[1] else 0)
            text_lps = lp.get("token_logprobs")
            if (
                type(text_lps) is list
                and len(text_lps) == len(logps)
                and all(map(_same_float, text_lps, logps))
            ):
                lp_out["token_logprobs"] = None
                flags |= Elided.TEXT_LOGPROBS
            if lp.get("tokens") == [f"{_TOKEN_ID}{tid}" for tid in completion]:
                lp_out["tokens"] = None
                flags |= Elided.TEXT_TOKENS
            if lp_out:
                first["logprobs"] = {**lp, **lp_out}
    if not flags:
        return response, 0
    stored = {**response, **top}
    if first:
        stored["choices"] = [{**choice, **first}, *choices[1:]]  # type: ignore[dict-item]
    return stored, int(flags)


def restore_response(
    stored: dict, flags: int, prompt: list[int], completion: list[int], logps: list[float]
) -> dict:
    """The response as it was before `elide_response`; `stored` is changed in place and returned."""
    if not flags:
        return stored
    elided = Elided(flags)
    if Elided.PROMPT_IDS in elided:
        stored["prompt_token_ids"] = prompt
    if elided == Elided.PROMPT_IDS:
        return stored
    choice = stored["choices"][0]
    if Elided.CHOICE_PROMPT_IDS in elided:
        choice["prompt_token_ids"] = prompt
    if Elided.COMPLETION_IDS in elided:
        choice["token_ids"] = completion
    lp = choice.get("logprobs")
    if Elided.CHAT_BYTES in elided:
        tokens = [f"{_TOKEN_ID}{tid}" for tid in completion]
        lp["content"] = [
            {"token": t, "logprob": x, "bytes": list(t.encode()), **rest}
            for t, x, rest in zip(tokens, logps, lp["content"], strict=True)
        ]
    elif Elided.CHAT_LOGPROBS in elided:
        lp["content"] = [
            {"token": f"{_TOKEN_ID}{tid}", "logprob": x, **rest}
            for tid, x, rest in zip(completion, logps, lp["content"], strict=True)
        ]
    if Elided.TEXT_LOGPROBS in elided:
        lp["token_logprobs"] = logps
    if Elided.TEXT_TOKENS in elided:
        lp["tokens"] = [f"{_TOKEN_ID}{tid}" for tid in completion]
    return stored
