"""The chat template of the tiny model and the hermes tool-call parser.

The template follows Qwen2.5's (ChatML with hermes-style tools): tools are listed in the system turn
inside `<tools></tools>`, the assistant calls them as `<tool_call>{"name": ..., "arguments": ...}
</tool_call>`, and tool results come back in a user turn inside `<tool_response></tool_response>`.
The parser mirrors vLLM's `hermes` tool parser, so a model folder served here and by vLLM yields the
same `message.tool_calls`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from engine.errors import BadRequest

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] }}
{%- else %}
{{- 'You are a helpful assistant.' }}
{%- endif %}
{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}
{{- "\\n" }}
{{- tool | tojson }}
{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}
{{- '\\n' + message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}
{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}
{{- tool_call.arguments }}
{%- else %}
{{- tool_call.arguments | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

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
        norm["content"] = _flatten_content(msg.get("content"), where)
        calls = msg.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise BadRequest(f"{where}.tool_calls must be a list", param="messages")
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(f"{where}.tool_calls[{j}] needs function.name", param="messages")
        out.append(norm)
    return out


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check the `tools` list has OpenAI's shape; a malformed tool is a 400 naming its index."""
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
    return tools or None


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
