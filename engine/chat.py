"""The chat template of the tiny model and the hermes tool-call parser.

The template is Qwen2.5's (ChatML with hermes-style tools): tools are listed in the system turn
inside `<tools></tools>`, the assistant calls them as `<tool_call>{"name": ..., "arguments": ...}
</tool_call>`, and tool results come back in a user turn inside `<tool_response></tool_response>`.
The parser mirrors vLLM's `hermes` tool parser, so a model folder served here and by vLLM yields the
same `message.tool_calls`.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from engine.errors import BadRequest

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

CHAT_TEMPLATE = (Path(__file__).with_name("qwen2_5.jinja")).read_text(encoding="utf-8")
"""Qwen2.5-Instruct's chat template, byte for byte (the `chat_template` of `Qwen/Qwen2.5-*-Instruct`; TRL
ships the same text as `trl/chat_templates/qwen2_5.jinja` and recognises it). The tiny model is a
`Qwen2ForCausalLM`, so it speaks its family's format: what TRL, `transformers` and vLLM's `hermes` tool
parser do with Qwen2.5 they do with it. (Qwen3's template is not used: it re-renders the last assistant
turn with a `<think>` block, so an agent's later prompts are not extensions of its earlier turns, which
capture and SFT rely on.)"""

RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": TOOL_CALL_START,
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""How a reply of this template parses into a message (transformers' `response_template`, saved with the
tokenizer): text content, then hermes `<tool_call>` JSON objects, up to `<|im_end|>`. With it,
`tokenizer.parse_response` and TRL (which looks for a response template before it tries to recognise the
chat template) read the tiny model's replies as they read Qwen's."""

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_ROLES = {"system", "user", "assistant", "tool", "developer"}


def _flatten_content(content: Any, where: str) -> str | None:
    """OpenAI allows content as a string or a list of parts; the template wants a string."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadRequest(f"{where}.content[{i}]: only text parts are supported", param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where}.content must be a string or a list of text parts", param="messages")


def normalize_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Validate OpenAI chat messages and flatten them into what the template renders."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    out = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise BadRequest(f"{where} needs a role among {sorted(_ROLES)}", param="messages")
        norm = dict(msg)
        if norm["role"] == "developer":
            norm["role"] = "system"
        # Qwen2.5's template concatenates content as a string; a null content renders as empty.
        norm["content"] = _flatten_content(msg.get("content"), where) or ""
        calls = msg.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls must be a list", param="messages")
            if calls:
                norm["tool_calls"] = [_template_tool_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)]
            else:
                del norm["tool_calls"]  # an empty list takes the template's plain-assistant path, as in vLLM
        out.append(norm)
    return out


def _template_tool_call(call: Any, where: str) -> dict[str, Any]:
    """A tool call as chat templates render it: `function.arguments` an object, not OpenAI's JSON string.

    Follows vLLM's `_postprocess_messages` (vllm/entrypoints/chat_utils.py in 0.28,
    vllm/renderers/chat_utils/chat_message.py in 0.33): a string is parsed, and
    arguments that are missing, not valid JSON or not an object become `{}` so a malformed call in the
    history does not fail every later turn.
    """
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest(f"{where} needs function.name", param="messages")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else {}
        except json.JSONDecodeError:
            args = {}
    return {**call, "function": {**fn, "arguments": args if isinstance(args, dict) else {}}}


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check the `tools` list has OpenAI's shape (a malformed tool is a 400 naming its index) and return it
    as vLLM hands it to the chat template: `ChatCompletionToolsParam(...).model_dump()`
    (`vllm/entrypoints/openai/chat_completion/protocol.py`, `FunctionDefinition` in
    `vllm/entrypoints/generate/base/protocol.py`). The template renders each tool with `tojson`, so the
    keys and their order are part of the prompt: `name`, `description` and `parameters` always (null when
    omitted), `strict` and `defer_loading` only when given, anything else dropped."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of function tools", param="tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"tools[{i}]: type must be 'function'", param="tools")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}].function.name must be a non-empty string", param="tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON Schema object", param="tools")
    return [_as_vllm_dumps(tool) for tool in tools] or None


def _as_vllm_dumps(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    defer = tool.get("defer_loading")
    function = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    if fn.get("strict") is not None:
        function["strict"] = fn["strict"]
    if fn.get("defer_loading", defer) is not None:  # the tool's own flag reaches its function (vLLM's validator)
        function["defer_loading"] = fn.get("defer_loading", defer)
    dumped: dict[str, Any] = {"type": "function", "function": function}
    if defer is not None:
        dumped["defer_loading"] = defer
    return dumped


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into (content, tool_calls) the way vLLM's hermes parser does.

    Content is the text before the first `<tool_call>` (None when empty). When any call fails to
    parse as JSON the whole output stays content and no calls are returned, as vLLM does.
    """
    if TOOL_CALL_START not in text:
        return text, []
    calls = []
    try:
        for closed, open_ended in _TOOL_CALL_RE.findall(text):
            raw = json.loads(closed or open_ended)
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                return text, []
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {
                        "name": raw["name"],
                        "arguments": json.dumps(raw.get("arguments", {}), ensure_ascii=False),
                    },
                }
            )
    except json.JSONDecodeError:
        return text, []
    content = text[: text.find(TOOL_CALL_START)]
    return (content or None), calls
