"""Anthropic's Messages API (`POST /v1/messages`) onto chat completions and back.

Formats as Anthropic documents them (docs.anthropic.com, "Messages" and "Streaming messages") and as
the `anthropic` SDK parses them (`anthropic/lib/streaming/_messages.py`, `accumulate_event`): a
message is `{id, type: "message", role, model, content: [blocks], stop_reason, stop_sequence, usage}`;
a stream is `message_start`, then per content block `content_block_start` / `content_block_delta`
(`text_delta`, `thinking_delta`, `input_json_delta`) / `content_block_stop`, a `ping`, then
`message_delta` (stop reason, cumulative usage) and `message_stop`; errors are
`{"type": "error", "error": {"type", "message"}}`, in a stream as an `error` event. OpenEnv 0.10's
capture proxy (`openenv/core/harness/capture/dialects/anthropic.py`) translates the same way; this one
refuses what the engine cannot serve (server tools, documents) instead of dropping it silently.

Request: `system` becomes the first (system) message; a user message's `tool_result` blocks become
`tool` messages (before its other content, as chat wants them right after the assistant's calls); an
assistant message's `tool_use` blocks become `tool_calls` and its `thinking` the `reasoning_content`;
text blocks join with newlines into one string (vLLM joins text parts so); `cache_control` is ignored.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import OrderedDict
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from capture_proxy.dialects.base import (
    arguments_object,
    arguments_text,
    bearer_from,
    chat_tools,
    copy_sampling,
    invalid,
    request_model,
    require_dict,
    require_list,
    require_str,
    set_stream,
    sse,
    unsupported,
)
from capture_proxy.responses import json_response

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_BILLING_LINE = re.compile(r"^\s*x-anthropic-billing-header:[^\n]*\n?", re.IGNORECASE)
"""Claude Code's first system line (`x-anthropic-billing-header: cc_version=...; cch=<hash>;`) is
billing metadata whose hash changes on every call: kept, it would make each prompt diverge from the
last one's tokens, so no call would extend the previous one in the rollout graph."""


class _SentArguments:
    """The arguments text of the tool calls this process sent as `tool_use` blocks, by block id.

    Anthropic's `input` is an object, so the text the engine wrote (its spacing, its key order) is lost
    on the way to the agent; when the agent sends the call back, that text is what the next prompt
    must hold for it to extend the last call's tokens (docs/design.md 3.2). An agent may send the input
    back with its tool schema's defaults filled in (Claude Code adds `"replace_all": false` to an Edit
    the engine wrote without it): the same call, so the engine's text stands. Bounded: the oldest
    entries go first, and a call not found (or changed otherwise) falls back to `json.dumps` of its input."""

    def __init__(self, limit: int = 100_000):
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._limit = limit

    def remember(self, block_id: str, text: str | None) -> None:
        if text:
            self._texts[block_id] = text
            if len(self._texts) > self._limit:
                self._texts.popitem(last=False)

    def text_for(self, block_id: str, value: Any, defaults: dict[str, Any] | None = None) -> str:
        """The engine's text of call `block_id` if `value` is its input (`defaults`: the tool schema's
        property defaults, which the agent may have added), else `value` as JSON."""
        text = self._texts.get(block_id)
        if text is not None:
            try:
                sent = json.loads(text)
            except ValueError:
                sent = None
            if sent == value or (
                isinstance(sent, dict) and _without_added_defaults(value, sent, defaults) == sent
            ):
                return text
        return arguments_text(value)


def _without_added_defaults(value: Any, sent: dict, defaults: dict[str, Any] | None) -> Any:
    """`value` less the keys that `sent` lacks and whose value is the schema's default for them."""
    if not isinstance(value, dict) or not defaults:
        return value
    return {k: v for k, v in value.items() if k in sent or k not in defaults or defaults[k] != v}


def _input_defaults(tools: Any) -> dict[str, dict[str, Any]]:
    """Tool name -> {property: default} from the request's tool schemas (what an agent may fill in)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools if isinstance(tools, list) else []:
        schema = tool.get("input_schema") if isinstance(tool, dict) else None
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(properties, dict):
            found[str(tool.get("name"))] = {
                k: p["default"] for k, p in properties.items() if isinstance(p, dict) and "default" in p
            }
    return found


_SENT = _SentArguments()


class AnthropicMessages:
    name = "anthropic-messages"

    def authorization(self, headers: Headers) -> str | None:
        # The SDK sends `x-api-key` (ANTHROPIC_API_KEY) or `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN).
        return bearer_from(headers)

    # -- request ---------------------------------------------------------------------------------

    def to_chat(self, body: Any) -> dict:
        model = request_model(body)
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise invalid("'max_tokens' is required and must be a positive integer", "max_tokens")
        messages = require_list(body.get("messages"), "messages")
        if not messages:
            raise invalid("'messages' must be a non-empty array", "messages")
        chat: list[dict] = []
        system = body.get("system")
        if system is not None:
            text = _BILLING_LINE.sub("", _system_text(system))
            if text:
                chat.append({"role": "system", "content": text})
        defaults = _input_defaults(body.get("tools"))
        for i, message in enumerate(messages):
            chat += _message(require_dict(message, f"messages[{i}]"), i, defaults)
        out: dict[str, Any] = {"model": model, "messages": chat, "max_tokens": max_tokens}
        copy_sampling(body, out, {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"})
        if body.get("stop_sequences") is not None:
            out["stop"] = require_list(body["stop_sequences"], "stop_sequences")
        tools = chat_tools(body, _tool)
        if tools:
            out["tools"] = tools
            if body.get("tool_choice") is not None:
                out.update(_tool_choice(require_dict(body["tool_choice"], "tool_choice")))
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive", "disabled"):
            out["chat_template_kwargs"] = {"enable_thinking": thinking["type"] != "disabled"}
        set_stream(body, out)
        return out

    # -- reply -----------------------------------------------------------------------------------

    def from_chat(self, reply: dict, request: dict) -> dict:
        choice = reply["choices"][0]
        message = choice.get("message") or {}
        content: list[dict] = []
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            block_id = call.get("id") or _tool_use_id()
            _SENT.remember(block_id, fn.get("arguments"))
            content.append(
                {
                    "type": "tool_use",
                    "id": block_id,
                    "name": fn.get("name", ""),
                    "input": arguments_object(fn.get("arguments")),
                }
            )
        stop_reason, stop_sequence = _stop(choice)
        return {
            "id": _message_id(),
            "type": "message",
            "role": "assistant",
            "model": request.get("model", ""),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _usage(reply.get("usage") or {}),
        }

    def stream(self, request: dict) -> _MessageStream:
        return _MessageStream(request.get("model", ""))

    def error(self, status: int, message: str, code: str | None, param: str | None = None) -> Response:
        return json_response(_error_body(status, message), status)


ANTHROPIC_MESSAGES = AnthropicMessages()


def _error_body(status: int, message: str) -> dict:
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def _tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _usage(usage: dict) -> dict:
    return {
        "input_tokens": usage.get("prompt_tokens", 0),
        "output_tokens": usage.get("completion_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _stop(choice: dict) -> tuple[str | None, str | None]:
    """Anthropic's stop reason and sequence; vLLM names the stop string that ended a completion in
    the choice's `stop_reason`."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return (_STOP_REASONS.get(finish, "end_turn") if finish else None), None


# -- request pieces --------------------------------------------------------------------------------


def _system_text(system: Any, where: str = "system") -> str:
    if isinstance(system, str):
        return system
    blocks = require_list(system, where)
    texts = []
    for i, block in enumerate(blocks):
        block = require_dict(block, f"{where}[{i}]")
        if block.get("type") != "text":
            raise invalid(f"{where}[{i}] must be a text block", f"{where}[{i}]")
        texts.append(require_str(block.get("text"), f"{where}[{i}].text"))
    return "\n".join(texts)


def _message(message: dict, i: int, defaults: dict[str, dict[str, Any]]) -> list[dict]:
    """The chat messages for one Anthropic message (a user turn with tool results becomes several)."""
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        # `system` mid-conversation: Claude Code sends its environment notes so, after the first prompt.
        raise invalid(f"messages[{i}].role must be 'user', 'assistant' or 'system'", f"messages[{i}].role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "system":
        return [{"role": "system", "content": _system_text(content, f"messages[{i}].content")}]
    blocks = require_list(content, f"messages[{i}].content")
    if role == "assistant":
        return [_assistant(blocks, i, defaults)]
    return _user(blocks, i)


def _assistant(blocks: list, i: int, defaults: dict[str, dict[str, Any]]) -> dict:
    texts: list[str] = []
    calls: list[dict] = []
    reasoning: list[str] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        block = require_dict(block, where)
        kind = block.get("type")
        if kind == "text":
            texts.append(require_str(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
            name = require_str(block.get("name"), f"{where}.name")
            call_id = require_str(block.get("id"), f"{where}.id")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": _SENT.text_for(call_id, block.get("input", {}), defaults.get(name)),
                    },
                }
            )
        elif kind == "thinking":
            reasoning.append(require_str(block.get("thinking"), f"{where}.thinking"))
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic's servers: no engine wrote it, none can read it
        else:
            raise unsupported(f"an assistant content block of type {kind!r}", where)
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    return out


def _user(blocks: list, i: int) -> list[dict]:
    results: list[dict] = []
    parts: list[dict] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        block = require_dict(block, where)
        kind = block.get("type")
        if kind == "tool_result":
            text, images = _tool_result_content(block.get("content"), where)
            call_id = require_str(block.get("tool_use_id"), f"{where}.tool_use_id")
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
            if images:  # chat's tool messages hold text only: the images follow as the user's
                parts += images
        elif kind == "text":
            parts.append({"type": "text", "text": require_str(block.get("text"), f"{where}.text")})
        elif kind == "image":
            parts.append(_image(block, where))
        else:
            raise unsupported(f"a user content block of type {kind!r}", where)
    if parts:
        results.append({"role": "user", "content": _parts_content(parts)})
    return results


def _tool_result_content(content: Any, where: str) -> tuple[str, list[dict]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts, images = [], []
    for k, block in enumerate(require_list(content, f"{where}.content")):
        at = f"{where}.content[{k}]"
        block = require_dict(block, at)
        if block.get("type") == "text":
            texts.append(require_str(block.get("text"), f"{at}.text"))
        elif block.get("type") == "image":
            images.append(_image(block, at))
        else:
            raise unsupported(f"a tool_result block of type {block.get('type')!r}", at)
    return "\n".join(texts), images


def _image(block: dict, where: str) -> dict:
    source = require_dict(block.get("source"), f"{where}.source")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{require_str(source.get('data'), f'{where}.source.data')}"
    elif source.get("type") == "url":
        url = require_str(source.get("url"), f"{where}.source.url")
    else:
        raise unsupported(f"an image source of type {source.get('type')!r}", f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _parts_content(parts: list[dict]) -> str | list[dict]:
    """One string when the parts are all text (joined by newlines), else the parts themselves."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool(tool: dict, i: int) -> list[dict]:
    kind = tool.get("type")
    if kind not in (None, "custom"):
        # Server tools (web search, code execution, Anthropic-defined bash/editor) run on Anthropic's side.
        raise unsupported(f"the server tool {kind!r}", f"tools[{i}]")
    name = require_str(tool.get("name"), f"tools[{i}].name")
    fn: dict[str, Any] = {
        "name": name,
        "parameters": require_dict(tool.get("input_schema") or {}, f"tools[{i}].input_schema"),
    }
    if tool.get("description") is not None:
        fn["description"] = require_str(tool["description"], f"tools[{i}].description")
    return [{"type": "function", "function": fn}]


def _tool_choice(choice: dict) -> dict:
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        name = require_str(choice.get("name"), "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise invalid("'tool_choice.type' must be one of auto, any, tool, none", "tool_choice.type")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


# -- the stream --------------------------------------------------------------------------------------


class _MessageStream:
    """Chat chunks to Anthropic's stream events: one content block at a time (thinking, text, or a
    tool_use per call), each closed before the next opens, as the API sends them."""

    def __init__(self, model: str):
        self.model = model
        self.id = _message_id()
        self.index = -1
        self.open: str | None = None
        """The kind of the open block: `thinking`, `text`, or `tool:<chat tool-call index>`."""
        self.arguments: list[str] = []
        self.block_id = ""
        self.pinged = False
        self.choice: dict = {}
        self.usage: dict = {}

    def start(self) -> bytes:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage({}),
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def feed(self, chunk: dict) -> bytes:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.choice = choice
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                out += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            if delta.get("content"):
                out += self._block("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                key = f"tool:{call.get('index', 0)}"
                if key != self.open:
                    self.block_id = call.get("id") or _tool_use_id()
                    block = {
                        "type": "tool_use",
                        "id": self.block_id,
                        "name": fn.get("name") or "",
                        "input": {},
                    }
                    out += self._block(key, block)
                if fn.get("arguments"):
                    self.arguments.append(fn["arguments"])
        return b"".join(out)

    def finish(self) -> bytes:
        out = self._close()
        stop_reason, stop_sequence = _stop(self.choice) if self.choice else ("end_turn", None)
        out.append(
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": _usage(self.usage),
                },
            )
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def fail(self, status: int, message: str) -> bytes:
        return sse("error", _error_body(status, message))

    def _block(self, kind: str, block: dict) -> list[bytes]:
        """Close the open block unless it is `kind`, and open a `kind` block."""
        if self.open == kind:
            return []
        out = self._close()
        self.index += 1
        self.open = kind
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        if not self.pinged:
            self.pinged = True
            out.append(sse("ping", {"type": "ping"}))
        return out

    def _delta(self, delta: dict) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open.startswith("tool:"):
            # A tool's input goes out whole when its call is complete: the SDKs parse partial JSON as it
            # arrives, and text a model wrote that is not a JSON object would break their parsers.
            text = "".join(self.arguments)
            self.arguments = []
            _SENT.remember(self.block_id, text)
            out.append(
                self._delta(
                    {"type": "input_json_delta", "partial_json": arguments_text(arguments_object(text))}
                )
            )
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open = None
        return out
