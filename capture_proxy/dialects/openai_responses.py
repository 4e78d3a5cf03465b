"""OpenAI's Responses API (`POST /v1/responses`) onto chat completions and back.

Formats as OpenAI documents them (platform.openai.com, "Responses" and "Streaming events") and as the
`openai` SDK checks them (`openai/lib/streaming/responses/_responses.py`: every item announced by
`response.output_item.added` before its deltas and finished by `response.output_item.done` with the
same id, one `response.created` first, lifecycle events with one response id). A response is
`{id, object: "response", created_at, status, model, output: [items], usage, ...}` whose items are
`reasoning`, `message` (`output_text` parts) and `function_call` (`call_id`, `name`, `arguments`); a
stream is `response.created`, `response.in_progress`, the items' events, then `response.completed`
(`response.incomplete` when the token limit cut it); each event carries a `sequence_number`. OpenEnv
0.10's capture proxy (`openenv/core/harness/capture/dialects/openai_responses.py`) does the same job.

The proxy keeps no responses (`store` is ignored, `previous_response_id` refused): the agent sends the
whole conversation in `input`, as codex does. Input items map onto chat messages: `instructions` and
system/developer messages become system messages, a `function_call` joins the assistant message of its
response (text and calls of one completion are one chat message, so the replayed prompt renders as the
engine wrote it), a `function_call_output` becomes a `tool` message, and a `reasoning` item becomes the
next assistant message's `reasoning_content`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from capture_proxy.dialects import responses_request as shape
from capture_proxy.dialects.base import bearer_from, invalid, sse, stream_fields, unsupported
from capture_proxy.dialects.shapes import parse_request
from capture_proxy.errors import ProxyRequestError
from capture_proxy.responses import json_response

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_REFUSED_FIELDS = ("previous_response_id", "conversation", "background", "prompt")
"""Fields that need state or features only OpenAI's servers have."""


class OpenAIResponses:
    name = "openai-responses"

    def authorization(self, headers: Headers) -> str | None:
        return bearer_from(headers)

    # -- request ---------------------------------------------------------------------------------

    def parse(self, body: Any) -> shape.ResponsesRequest:
        request = parse_request(shape.ResponsesRequest, body)
        for field in _REFUSED_FIELDS:
            if getattr(request, field):
                raise unsupported(
                    f"'{field}' (the proxy keeps no responses; send the whole conversation in 'input')", field
                )
        return request

    def to_chat(self, request: shape.ResponsesRequest) -> dict:
        messages: list[dict] = []
        if request.instructions:
            messages.append({"role": "system", "content": request.instructions})
        if isinstance(request.input, str):
            messages.append({"role": "user", "content": request.input})
        else:
            messages += _input_messages(request.input)
        if not messages:
            raise invalid("'input' must hold at least one message", "input")
        out: dict[str, Any] = {"model": request.model, "messages": messages}
        settings = {
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_output_tokens,
            "parallel_tool_calls": request.parallel_tool_calls,
        }
        out.update({k: v for k, v in settings.items() if v is not None})
        if request.tools:
            out["tools"] = [fn for tool in request.tools for fn in _tool(tool)]
            if request.tool_choice is not None:
                out["tool_choice"] = _tool_choice(request.tool_choice)
        if request.text is not None and request.text.format is not None:
            fmt = _response_format(request.text.format)
            if fmt is not None:
                out["response_format"] = fmt
        out.update(stream_fields(request.stream))
        return out

    # -- reply -----------------------------------------------------------------------------------

    def from_chat(self, reply: dict, request: shape.ResponsesRequest) -> dict:
        choice = reply["choices"][0]
        message = choice.get("message") or {}
        output: list[dict] = []
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        if reasoning:
            output.append(_reasoning_item(_item_id("rs"), reasoning))
        if message.get("content"):
            output.append(_message_item(_item_id("msg"), message["content"], "completed"))
        namespaces = _namespaces(request)
        for call in message.get("tool_calls") or ():
            fn = call.get("function") or {}
            output.append(
                _call_item(
                    _item_id("fc"),
                    call.get("id") or _item_id("call"),
                    fn.get("name", ""),
                    fn.get("arguments") or "",
                    "completed",
                    namespaces,
                )
            )
        return _response(_item_id("resp"), request, output, choice.get("finish_reason"), reply.get("usage"))

    def stream(self, request: shape.ResponsesRequest) -> _ResponseStream:
        return _ResponseStream(request)

    def error(self, status: int, message: str, code: str | None, param: str | None = None) -> Response:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return json_response(
            ProxyRequestError(status, message, type=kind, param=param, code=code).body(), status
        )


OPENAI_RESPONSES = OpenAIResponses()


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: dict | None) -> dict:
    usage = usage or {}
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens", prompt + completion),
    }


def _response(
    rid: str,
    request: shape.ResponsesRequest,
    output: list[dict],
    finish: str | None,
    usage: dict | None,
    *,
    in_progress: bool = False,
) -> dict:
    """The response object: in progress (a stream's first events), else completed, or incomplete when
    the token limit ended the completion. It echoes the request's settings, as OpenAI's does."""
    status = "in_progress" if in_progress else "completed"
    incomplete = None
    if finish == "length" and not in_progress:
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": _given(request.parallel_tool_calls, True),
        "previous_response_id": None,
        "reasoning": _echo(request.reasoning) or {"effort": None, "summary": None},
        "store": _given(request.store, True),
        "temperature": _given(request.temperature, 1.0),
        "text": _echo(request.text) or {"format": {"type": "text"}},
        "tool_choice": _echo(request.tool_choice) or "auto",
        "tools": [_echo(tool) for tool in request.tools or ()],
        "top_p": _given(request.top_p, 1.0),
        "truncation": request.truncation or "disabled",
        "usage": None if status == "in_progress" else _usage(usage),
        "user": None,
        "metadata": request.metadata or {},
    }


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _echo(value: Any) -> Any:
    """A request setting as the agent sent it (a model's fields it set, by their JSON names)."""
    return value.model_dump(exclude_unset=True, by_alias=True) if isinstance(value, shape.Shape) else value


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str, namespaces: dict[str, str]
) -> dict:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def _reasoning_item(item_id: str, text: str | None) -> dict:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content}


# -- request pieces --------------------------------------------------------------------------------


def _input_messages(items: list[Any]) -> list[dict]:
    messages: list[dict] = []
    reasoning: list[str] = []
    for item in items:
        if isinstance(item, shape.MessageItem):
            role = _ROLES[item.role]
            message: dict[str, Any] = {"role": role, "content": _content(item.content, role)}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            messages.append(message)
        elif isinstance(item, shape.FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = "\n".join(reasoning)
                    reasoning = []
                messages.append(message)
        elif isinstance(item, shape.FunctionCallOutputItem):
            text = item.output if isinstance(item.output, str) else _text(item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
        else:
            reasoning.append("".join(part.text for part in item.content or item.summary))
    return messages


def _content(content: str | list[Any], role: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    if any(isinstance(part, shape.ImagePart) for part in content):
        return [_part(part) for part in content]
    # An assistant's text parts are one completion's text, joined as it was written.
    return _text(content, "" if role == "assistant" else "\n")


def _part_text(part: shape.TextPart | shape.RefusalPart) -> str:
    return part.text if isinstance(part, shape.TextPart) else part.refusal


def _text(parts: list[Any], joiner: str = "\n") -> str:
    return joiner.join(_part_text(part) for part in parts)


def _part(part: Any) -> dict:
    if isinstance(part, shape.ImagePart):
        return {"type": "image_url", "image_url": {"url": part.image_url}}
    return {"type": "text", "text": _part_text(part)}


def _function(tool: shape.FunctionTool) -> dict:
    fn: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        fn["description"] = tool.description
    fn["parameters"] = tool.parameters.whole() if tool.parameters else {"type": "object", "properties": {}}
    if tool.strict is not None:
        fn["strict"] = tool.strict
    return {"type": "function", "function": fn}


def _tool(tool: shape.FunctionTool | shape.NamespaceTool) -> list[dict]:
    """A function tool as chat's; a `namespace` (a named group of functions, as codex sends its
    sub-agent tools) as its functions, which the engine sees by their own names."""
    if isinstance(tool, shape.NamespaceTool):
        return [_function(inner) for inner in tool.tools]
    return [_function(tool)]


def _namespaces(request: shape.ResponsesRequest) -> dict[str, str]:
    """The namespace of each function the request offered inside one (function name -> namespace)."""
    return {
        inner.name: tool.name
        for tool in request.tools or ()
        if isinstance(tool, shape.NamespaceTool)
        for inner in tool.tools
    }


def _tool_choice(choice: str | shape.FunctionChoice) -> Any:
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(fmt: shape.TextFormat) -> dict | None:
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {k: v for k, v in _echo(fmt).items() if k != "type"}  # name, description, schema, strict
    return {"type": "json_schema", "json_schema": schema}


# -- the stream --------------------------------------------------------------------------------------


class _ResponseStream:
    """Chat chunks to Responses stream events: one output item at a time (reasoning, a message, or a
    function call per chat tool call), each done before the next is added, numbered in sequence."""

    def __init__(self, request: shape.ResponsesRequest):
        self.request = request
        self.namespaces = _namespaces(request)
        self.id = _item_id("resp")
        self.seq = 0
        self.output: list[dict] = []
        """Finished items, in output order."""
        self.open: dict | None = None
        self.open_key: str | None = None
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def start(self) -> bytes:
        response = _response(self.id, self.request, [], None, None, in_progress=True)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def feed(self, chunk: dict) -> bytes:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out: list[bytes] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                out += self._item("reasoning", lambda: _reasoning_item(_item_id("rs"), None))
                out.append(self._text_delta("response.reasoning_text.delta", reasoning))
            if delta.get("content"):
                out += self._item("message", lambda: _message_item(_item_id("msg"), None, "in_progress"))
                out.append(self._text_delta("response.output_text.delta", delta["content"], logprobs=[]))
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                key = f"call:{call.get('index', 0)}"
                out += self._item(
                    key,
                    lambda call=call, fn=fn: _call_item(
                        _item_id("fc"),
                        call.get("id") or _item_id("call"),
                        fn.get("name") or "",
                        "",
                        "in_progress",
                        self.namespaces,
                    ),
                )
                if fn.get("arguments"):
                    self.text.append(fn["arguments"])
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=self.open["id"],
                            output_index=len(self.output),
                            delta=fn["arguments"],
                        )
                    )
        return b"".join(out)

    def finish(self) -> bytes:
        out = self._close()
        response = _response(self.id, self.request, self.output, self.finish_reason, self.usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=response))
        return b"".join(out)

    def fail(self, status: int, message: str) -> bytes:
        response = _response(self.id, self.request, self.output, None, self.usage)
        code = "server_error" if status >= 500 else "invalid_request"
        response |= {"status": "failed", "error": {"code": code, "message": message}}
        return self._event("response.failed", response=response)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, data)

    def _item(self, key: str, make) -> list[bytes]:
        """Finish the open item unless it is `key`'s, and add a new one made by `make()`."""
        if self.open_key == key:
            return []
        out = self._close()
        self.open, self.open_key = make(), key
        index = len(self.output)
        out.append(self._event("response.output_item.added", output_index=index, item=self.open))
        if self.open["type"] == "message":
            out.append(self._part_event("response.content_part.added", _text_part("")))
        elif self.open["type"] == "reasoning":
            out.append(
                self._part_event("response.content_part.added", {"type": "reasoning_text", "text": ""})
            )
        return out

    def _part_event(self, kind: str, part: dict) -> bytes:
        return self._event(
            kind, item_id=self.open["id"], output_index=len(self.output), content_index=0, part=part
        )

    def _text_delta(self, kind: str, text: str, **extra: Any) -> bytes:
        self.text.append(text)
        return self._event(
            kind, item_id=self.open["id"], output_index=len(self.output), content_index=0, delta=text, **extra
        )

    def _close(self) -> list[bytes]:
        item = self.open
        if item is None:
            return []
        text = "".join(self.text)
        self.text = []
        index = len(self.output)
        out: list[bytes] = []
        if item["type"] == "message":
            part = _text_part(text)
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(self._part_event("response.content_part.done", part))
            item = item | {"status": "completed", "content": [part]}
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
            out.append(self._part_event("response.content_part.done", part))
            item = item | {"content": [part]}
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=text,
                )
            )
            item = item | {"status": "completed", "arguments": text}
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self.open = self.open_key = None
        return out
