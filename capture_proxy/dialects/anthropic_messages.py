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

from capture_proxy.dialects import anthropic_request as shape
from capture_proxy.dialects.base import arguments_object, arguments_text, bearer_from, sse, stream_fields
from capture_proxy.dialects.shapes import parse_request
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


def _input_defaults(tools: list[shape.CustomTool] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> {property: default} from the request's tool schemas (what an agent may fill in)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        properties = tool.input_schema.properties if tool.input_schema else None
        if properties:
            found[tool.name] = {
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

    def parse(self, body: Any) -> shape.MessagesRequest:
        return parse_request(shape.MessagesRequest, body)

    def to_chat(self, request: shape.MessagesRequest) -> dict:
        chat: list[dict] = []
        if request.system is not None:
            text = _BILLING_LINE.sub("", _joined(request.system))
            if text:
                chat.append({"role": "system", "content": text})
        defaults = _input_defaults(request.tools)
        for message in request.messages:
            chat += _message(message, defaults)
        out: dict[str, Any] = {"model": request.model, "messages": chat, "max_tokens": request.max_tokens}
        sampling = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k}
        out.update({k: v for k, v in sampling.items() if v is not None})
        if request.stop_sequences is not None:
            out["stop"] = request.stop_sequences
        if request.tools:
            out["tools"] = [_tool(tool) for tool in request.tools]
            if request.tool_choice is not None:
                out.update(_tool_choice(request.tool_choice))
        if request.thinking is not None:
            out["chat_template_kwargs"] = {"enable_thinking": request.thinking.type != "disabled"}
        out.update(stream_fields(request.stream))
        return out

    # -- reply -----------------------------------------------------------------------------------

    def from_chat(self, reply: dict, request: shape.MessagesRequest) -> dict:
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
            "model": request.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _usage(reply.get("usage") or {}),
        }

    def stream(self, request: shape.MessagesRequest) -> _MessageStream:
        return _MessageStream(request.model)

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


def _joined(content: str | list[shape.TextBlock]) -> str:
    """A system prompt or message as one string: its text blocks joined by newlines."""
    return content if isinstance(content, str) else "\n".join(block.text for block in content)


def _message(message: Any, defaults: dict[str, dict[str, Any]]) -> list[dict]:
    """The chat messages for one Anthropic message (a user turn with tool results becomes several)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if isinstance(message, shape.SystemMessage):
        return [{"role": "system", "content": _joined(message.content)}]
    if isinstance(message, shape.AssistantMessage):
        return [_assistant(message.content, defaults)]
    return _user(message.content)


def _assistant(blocks: list[Any], defaults: dict[str, dict[str, Any]]) -> dict:
    texts: list[str] = []
    calls: list[dict] = []
    reasoning: list[str] = []
    for block in blocks:
        if isinstance(block, shape.TextBlock):
            texts.append(block.text)
        elif isinstance(block, shape.ToolUseBlock):
            arguments = _SENT.text_for(block.id, block.input, defaults.get(block.name))
            calls.append(
                {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
            )
        elif isinstance(block, shape.ThinkingBlock):
            reasoning.append(block.thinking)
        # redacted_thinking: encrypted by Anthropic's servers, no engine wrote it, none can read it
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    return out


def _user(blocks: list[Any]) -> list[dict]:
    results: list[dict] = []
    parts: list[dict] = []
    for block in blocks:
        if isinstance(block, shape.ToolResultBlock):
            text, images = _tool_result_content(block.content)
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
            parts += images  # chat's tool messages hold text only: the images follow as the user's
        elif isinstance(block, shape.TextBlock):
            parts.append({"type": "text", "text": block.text})
        else:
            parts.append(_image(block))
    if parts:
        results.append({"role": "user", "content": _parts_content(parts)})
    return results


def _tool_result_content(content: str | list[Any] | None) -> tuple[str, list[dict]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts = [block.text for block in content if isinstance(block, shape.TextBlock)]
    images = [_image(block) for block in content if isinstance(block, shape.ImageBlock)]
    return "\n".join(texts), images


def _image(block: shape.ImageBlock) -> dict:
    source = block.source
    if isinstance(source, shape.Base64Source):
        url = f"data:{source.media_type};base64,{source.data}"
    else:
        url = source.url
    return {"type": "image_url", "image_url": {"url": url}}


def _parts_content(parts: list[dict]) -> str | list[dict]:
    """One string when the parts are all text (joined by newlines), else the parts themselves."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool(tool: shape.CustomTool) -> dict:
    fn: dict[str, Any] = {
        "name": tool.name,
        "parameters": tool.input_schema.whole() if tool.input_schema else {},
    }
    if tool.description is not None:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _tool_choice(choice: shape.ToolChoice | shape.NamedToolChoice) -> dict:
    out: dict[str, Any] = {}
    if isinstance(choice, shape.NamedToolChoice):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = _CHOICES[choice.type]
    if choice.disable_parallel_tool_use:
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
