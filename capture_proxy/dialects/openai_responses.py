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

from capture_proxy.dialects.base import (
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
from capture_proxy.errors import ProxyRequestError
from capture_proxy.responses import json_response

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_REFUSED_FIELDS = ("previous_response_id", "conversation", "background", "prompt")
"""Fields that need state or features only OpenAI's servers have."""


class OpenAIResponses:
    name = "openai-responses"

    def authorization(self, headers: Headers) -> str | None:
        return bearer_from(headers)

    # -- request ---------------------------------------------------------------------------------

    def to_chat(self, body: Any) -> dict:
        model = request_model(body)
        for field in _REFUSED_FIELDS:
            if body.get(field):
                raise unsupported(
                    f"'{field}' (the proxy keeps no responses; send the whole conversation in 'input')", field
                )
        messages: list[dict] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": require_str(body["instructions"], "instructions")})
        source = body.get("input")
        if isinstance(source, str):
            messages.append({"role": "user", "content": source})
        else:
            messages += _input_messages(require_list(source, "input"))
        if not messages:
            raise invalid("'input' must hold at least one message", "input")
        out: dict[str, Any] = {"model": model, "messages": messages}
        copy_sampling(
            body, out, {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}
        )
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
        tools = chat_tools(body, _tool)
        if tools:
            out["tools"] = tools
            if body.get("tool_choice") is not None:
                out["tool_choice"] = _tool_choice(body["tool_choice"])
        text = body.get("text")
        if isinstance(text, dict) and isinstance(text.get("format"), dict):
            fmt = _response_format(text["format"])
            if fmt is not None:
                out["response_format"] = fmt
        set_stream(body, out)
        return out

    # -- reply -----------------------------------------------------------------------------------

    def from_chat(self, reply: dict, request: dict) -> dict:
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

    def stream(self, request: dict) -> _ResponseStream:
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
    request: dict,
    output: list[dict],
    finish: str | None,
    usage: dict | None,
    *,
    in_progress: bool = False,
) -> dict:
    """The response object: in progress (a stream's first events), else completed, or incomplete when
    the token limit ended the completion."""
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
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": request.get("model", ""),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation", "disabled"),
        "usage": None if status == "in_progress" else _usage(usage),
        "user": None,
        "metadata": request.get("metadata") or {},
    }


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


def _input_messages(items: list) -> list[dict]:
    messages: list[dict] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        item = require_dict(item, where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise invalid(
                    f"{where}.role must be one of user, assistant, system, developer", f"{where}.role"
                )
            message: dict[str, Any] = {"role": role, "content": _content(item.get("content"), where, role)}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind == "function_call":
            call = {
                "id": require_str(item.get("call_id"), f"{where}.call_id"),
                "type": "function",
                "function": {
                    "name": require_str(item.get("name"), f"{where}.name"),
                    "arguments": require_str(item.get("arguments", ""), f"{where}.arguments"),
                },
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
        elif kind == "function_call_output":
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else _text(require_list(output, f"{where}.output"), f"{where}.output")
            )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": require_str(item.get("call_id"), f"{where}.call_id"),
                    "content": text,
                }
            )
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.append(
                "".join(
                    p.get("text", "") for p in require_list(parts, f"{where}.content") if isinstance(p, dict)
                )
            )
        else:
            raise unsupported(f"an input item of type {kind!r}", where)
    return messages


def _content(content: Any, where: str, role: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    parts = require_list(content, f"{where}.content")
    if any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return [
            _part(require_dict(p, f"{where}.content[{j}]"), f"{where}.content[{j}]")
            for j, p in enumerate(parts)
        ]
    # An assistant's text parts are one completion's text, joined as it was written.
    return _text(parts, f"{where}.content", "" if role == "assistant" else "\n")


def _text(parts: list, where: str, joiner: str = "\n") -> str:
    texts = []
    for j, part in enumerate(parts):
        part = require_dict(part, f"{where}[{j}]")
        if part.get("type") not in _TEXT_PARTS:
            raise unsupported(f"a content part of type {part.get('type')!r}", f"{where}[{j}]")
        texts.append(require_str(part.get("text", part.get("refusal")), f"{where}[{j}].text"))
    return joiner.join(texts)


def _part(part: dict, where: str) -> dict:
    if part.get("type") == "input_image":
        url = part.get("image_url") or part.get("file_id")
        return {"type": "image_url", "image_url": {"url": require_str(url, f"{where}.image_url")}}
    if part.get("type") in _TEXT_PARTS:
        return {"type": "text", "text": require_str(part.get("text"), f"{where}.text")}
    raise unsupported(f"a content part of type {part.get('type')!r}", where)


def _tool(tool: dict, i: int, where: str | None = None) -> list[dict]:
    """A function tool as chat's; a `namespace` (a named group of functions, as codex sends its
    sub-agent tools) as its functions, which the engine sees by their own names."""
    where = where or f"tools[{i}]"
    if tool.get("type") == "namespace":
        inner = require_list(tool.get("tools"), f"{where}.tools")
        return [
            fn
            for j, t in enumerate(inner)
            for fn in _tool(require_dict(t, f"{where}.tools[{j}]"), j, f"{where}.tools[{j}]")
        ]
    if tool.get("type") != "function":
        # Hosted tools (web_search, file_search, code_interpreter, mcp, ...) run on OpenAI's side.
        raise unsupported(f"the tool type {tool.get('type')!r}", where)
    fn: dict[str, Any] = {"name": require_str(tool.get("name"), f"{where}.name")}
    if tool.get("description") is not None:
        fn["description"] = require_str(tool["description"], f"{where}.description")
    fn["parameters"] = require_dict(
        tool.get("parameters") or {"type": "object", "properties": {}}, f"{where}.parameters"
    )
    if tool.get("strict") is not None:
        fn["strict"] = tool["strict"]
    return [{"type": "function", "function": fn}]


def _namespaces(request: dict) -> dict[str, str]:
    """The namespace of each function the request offered inside one (function name -> namespace)."""
    return {
        inner["name"]: tool["name"]
        for tool in request.get("tools") or ()
        if isinstance(tool, dict) and tool.get("type") == "namespace"
        for inner in tool.get("tools") or ()
        if isinstance(inner, dict) and isinstance(inner.get("name"), str)
    }


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": require_str(choice.get("name"), "tool_choice.name")}}
    raise unsupported(f"the tool_choice {choice!r}", "tool_choice")


def _response_format(fmt: dict) -> dict | None:
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported(f"the text format {kind!r}", "text.format")


# -- the stream --------------------------------------------------------------------------------------


class _ResponseStream:
    """Chat chunks to Responses stream events: one output item at a time (reasoning, a message, or a
    function call per chat tool call), each done before the next is added, numbered in sequence."""

    def __init__(self, request: dict):
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
