"""The sandbox-facing routes as the fuzz tests see them: a schema of each route's request (the slice of
the documented API an agent sends, small enough for schemathesis to cover, as an OpenAPI document), and
valid request bodies holding every feature the proxy translates, which the mutation fuzzer changes.

The chat routes follow OpenAI's API reference (Chat Completions, Completions), `/v1/messages`
Anthropic's Messages API (`anthropic.types.MessageCreateParams`), and `/v1/responses` OpenAI's
Responses API (`openai.types.responses.ResponseCreateParams`).
"""

from __future__ import annotations

from typing import Any

from tests.reliability.conftest import MODEL

SAMPLING_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
ROUTES = (*SAMPLING_ROUTES, "/v1/models")

_TEXT = {"type": "string", "maxLength": 200}
_NAME = {"type": "string", "minLength": 1, "maxLength": 20}
_OBJECT_SCHEMA = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["object"]},
        "properties": {"type": "object", "maxProperties": 2, "additionalProperties": {"type": "object"}},
        "required": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
    },
}
"""A tool's parameters: a JSON schema of an object."""


def _obj(required: list[str], **properties: Any) -> dict:
    return {"type": "object", "required": required, "properties": properties}


def _array(items: Any, max_items: int = 3, min_items: int = 0) -> dict:
    return {"type": "array", "minItems": min_items, "maxItems": max_items, "items": items}


def _kind(*tags: str) -> dict:
    return {"type": "string", "enum": list(tags)}


# -- OpenAI chat and completions --------------------------------------------------------------------

_CHAT_PART = {
    "anyOf": [
        _obj(["type", "text"], type=_kind("text"), text=_TEXT),
        _obj(["type", "image_url"], type=_kind("image_url"), image_url=_obj(["url"], url=_TEXT)),
    ]
}
_CHAT_MESSAGE = _obj(
    ["role"],
    role=_kind("system", "user", "assistant", "tool"),
    content={"anyOf": [{"type": ["string", "null"], "maxLength": 200}, _array(_CHAT_PART)]},
    tool_call_id={"type": "string"},
    tool_calls=_array(
        _obj(
            ["id", "type", "function"],
            id={"type": "string"},
            type=_kind("function"),
            # The arguments are any string: models write broken JSON too.
            function=_obj(["name", "arguments"], name={"type": "string"}, arguments={"type": "string"}),
        ),
        max_items=2,
    ),
)
_CHAT_TOOL = _obj(
    ["type", "function"],
    type=_kind("function"),
    function=_obj(["name"], name=_NAME, description=_TEXT, parameters=_OBJECT_SCHEMA),
)
_SAMPLING = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 32},
    "seed": {"type": "integer"},
    "stop": {"anyOf": [_TEXT, _array(_TEXT, max_items=2)]},
    "stream": {"type": "boolean"},
    "n": {"type": "integer", "enum": [1]},
}
CHAT_REQUEST = _obj(
    ["model", "messages"],
    model=_kind(MODEL),
    messages=_array(_CHAT_MESSAGE, max_items=4, min_items=1),
    tools=_array(_CHAT_TOOL, max_items=2),
    tool_choice={
        "anyOf": [
            _kind("none", "auto", "required"),
            _obj(["type", "function"], type=_kind("function"), function=_obj(["name"], name=_NAME)),
        ]
    },
    logprobs={"type": "boolean"},
    top_logprobs={"type": "integer", "minimum": 0, "maximum": 20},
    **_SAMPLING,
)
COMPLETION_REQUEST = _obj(
    ["model", "prompt"],
    model=_kind(MODEL),
    prompt={
        "anyOf": [
            {"type": "string", "minLength": 1, "maxLength": 200},
            _array({"type": "integer", "minimum": 3, "maximum": 258}, max_items=16, min_items=1),
        ]
    },
    logprobs={"type": "integer", "minimum": 0, "maximum": 5},
    **_SAMPLING,
)

# -- Anthropic Messages ---------------------------------------------------------------------------

_TEXT_BLOCK = _obj(["type", "text"], type=_kind("text"), text=_TEXT)
_IMAGE_BLOCK = _obj(
    ["type", "source"],
    type=_kind("image"),
    source={
        "anyOf": [
            _obj(
                ["type", "media_type", "data"],
                type=_kind("base64"),
                media_type=_kind("image/png"),
                data=_TEXT,
            ),
            _obj(["type", "url"], type=_kind("url"), url=_TEXT),
        ]
    },
)
_TOOL_RESULT_BLOCK = _obj(
    ["type", "tool_use_id"],
    type=_kind("tool_result"),
    tool_use_id=_NAME,
    content={"anyOf": [_TEXT, _array({"anyOf": [_TEXT_BLOCK, _IMAGE_BLOCK]}, max_items=2)]},
    is_error={"type": "boolean"},
)
_ASSISTANT_BLOCKS = [
    _TEXT_BLOCK,
    _obj(
        ["type", "id", "name", "input"],
        type=_kind("tool_use"),
        id=_NAME,
        name=_NAME,
        input={"type": "object"},
    ),
    _obj(["type", "thinking", "signature"], type=_kind("thinking"), thinking=_TEXT, signature=_TEXT),
    _obj(["type", "data"], type=_kind("redacted_thinking"), data=_TEXT),
]


def _turn(role: str, blocks: list[dict]) -> dict:
    """A message of `role`: a string, or an array of the blocks that role may send."""
    return _obj(["role", "content"], role=_kind(role), content={"anyOf": [_TEXT, _array({"anyOf": blocks})]})


_ANTHROPIC_MESSAGE = {
    "anyOf": [
        _turn("user", [_TEXT_BLOCK, _IMAGE_BLOCK, _TOOL_RESULT_BLOCK]),
        _turn("assistant", _ASSISTANT_BLOCKS),
    ]
}
MESSAGES_REQUEST = _obj(
    ["model", "max_tokens", "messages"],
    model=_NAME,
    max_tokens={"type": "integer", "minimum": 1, "maximum": 32},
    messages=_array(_ANTHROPIC_MESSAGE, max_items=4, min_items=1),
    system={"anyOf": [_TEXT, _array(_TEXT_BLOCK, max_items=2)]},
    temperature={"type": "number", "minimum": 0, "maximum": 1},
    top_p={"type": "number", "minimum": 0, "maximum": 1},
    top_k={"type": "integer", "minimum": 0, "maximum": 500},
    stop_sequences=_array(_TEXT, max_items=2),
    stream={"type": "boolean"},
    tools=_array(
        _obj(["name", "input_schema"], name=_NAME, description=_TEXT, input_schema=_OBJECT_SCHEMA), 2
    ),
    tool_choice={
        "anyOf": [
            _obj(["type"], type=_kind("auto", "any", "none"), disable_parallel_tool_use={"type": "boolean"}),
            _obj(["type", "name"], type=_kind("tool"), name=_NAME),
        ]
    },
    thinking={
        "anyOf": [
            _obj(
                ["type", "budget_tokens"],
                type=_kind("enabled"),
                budget_tokens={"type": "integer", "minimum": 1024},
            ),
            _obj(["type"], type=_kind("disabled", "adaptive")),
        ]
    },
    metadata=_obj([], user_id=_NAME),
)

# -- OpenAI Responses -----------------------------------------------------------------------------

_INPUT_PART = {
    "anyOf": [
        _obj(["type", "text"], type=_kind("input_text", "output_text"), text=_TEXT),
        _obj(["type", "image_url"], type=_kind("input_image"), image_url=_TEXT, detail=_kind("auto", "low")),
    ]
}
_INPUT_ITEM = {
    "anyOf": [
        _obj(
            ["role", "content"],
            type=_kind("message"),
            role=_kind("user", "assistant", "system", "developer"),
            content={"anyOf": [_TEXT, _array(_INPUT_PART)]},
        ),
        _obj(
            ["type", "call_id", "name", "arguments"],
            type=_kind("function_call"),
            call_id=_NAME,
            name=_NAME,
            arguments=_TEXT,
        ),
        _obj(["type", "call_id", "output"], type=_kind("function_call_output"), call_id=_NAME, output=_TEXT),
        _obj(
            ["type", "summary"],
            type=_kind("reasoning"),
            summary=_array(_obj(["type", "text"], type=_kind("summary_text"), text=_TEXT), max_items=2),
        ),
    ]
}
RESPONSES_REQUEST = _obj(
    ["model", "input"],
    model=_NAME,
    input={"anyOf": [_TEXT, _array(_INPUT_ITEM, max_items=4)]},
    instructions=_TEXT,
    max_output_tokens={"type": "integer", "minimum": 1, "maximum": 32},
    temperature={"type": "number", "minimum": 0, "maximum": 2},
    top_p={"type": "number", "minimum": 0, "maximum": 1},
    parallel_tool_calls={"type": "boolean"},
    stream={"type": "boolean"},
    store={"type": "boolean"},
    tools=_array(
        _obj(
            ["type", "name"],
            type=_kind("function"),
            name=_NAME,
            description=_TEXT,
            parameters=_OBJECT_SCHEMA,
            strict={"type": "boolean"},
        ),
        max_items=2,
    ),
    tool_choice={
        "anyOf": [
            _kind("auto", "none", "required"),
            _obj(["type", "name"], type=_kind("function"), name=_NAME),
        ]
    },
    text=_obj([], format={"anyOf": [_obj(["type"], type=_kind("text", "json_object"))]}),
    reasoning=_obj([], effort=_kind("low", "medium", "high"), summary=_kind("auto", "concise", "detailed")),
    metadata={"type": "object", "maxProperties": 2, "additionalProperties": _TEXT},
    truncation=_kind("auto", "disabled"),
)

REQUESTS = {
    "/v1/chat/completions": CHAT_REQUEST,
    "/v1/completions": COMPLETION_REQUEST,
    "/v1/messages": MESSAGES_REQUEST,
    "/v1/responses": RESPONSES_REQUEST,
}


def openapi(route: str) -> dict:
    """An OpenAPI document of one route, for schemathesis."""
    if route == "/v1/models":
        # It reads no parameter; a few it ignores give the fuzzer cases to send.
        junk = [{"name": name, "in": "query", "schema": {"type": "string"}} for name in ("after", "limit")]
        operation: dict = {
            "get": {"parameters": junk, "responses": {"200": {"description": "the served models"}}}
        }
    else:
        body = {"required": True, "content": {"application/json": {"schema": REQUESTS[route]}}}
        operation = {"post": {"requestBody": body, "responses": {"200": {"description": "a completion"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": f"capture proxy agent route {route}", "version": "1"},
        "paths": {route: operation},
    }


# -- valid bodies, the mutation fuzzer's seeds --------------------------------------------------------

_PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
_PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

SEEDS: dict[str, list[dict]] = {
    "/v1/chat/completions": [
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "README.md"},
            ],
            "tools": [{"type": "function", "function": {"name": "bash", "description": "Run.", "parameters": _PARAMETERS}}],
            "tool_choice": "auto",
            "max_tokens": 16,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["\n\n"],
            "logprobs": True,
            "top_logprobs": 2,
            "stream_options": {"include_usage": True},
            "n": 1,
        },
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 8},
    ],
    "/v1/completions": [
        {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 8, "logprobs": 1, "temperature": 0.5, "stop": "\n"},
        {"model": MODEL, "prompt": [72, 105, 33], "max_tokens": 4, "seed": 3, "stream_options": {"include_usage": True}},
    ],
    "/v1/messages": [
        {
            "model": "claude-sonnet",
            "max_tokens": 32,
            "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "ls will do", "signature": ""},
                        {"type": "text", "text": "Listing."},
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [
                                {"type": "text", "text": "README.md"},
                                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _PIXEL}},
                            ],
                        },
                        {"type": "text", "text": "Now read it."},
                    ],
                },
                {"role": "system", "content": "The working directory is /app."},
            ],
            "tools": [{"name": "bash", "description": "Run a shell command.", "input_schema": _PARAMETERS}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "temperature": 1,
            "top_p": 0.95,
            "top_k": 40,
            "stop_sequences": ["</answer>"],
            "metadata": {"user_id": "u1"},
        },
        {
            "model": "claude-haiku",
            "max_tokens": 8,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
            ],
            "tools": [{"type": "custom", "name": "read", "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "tool", "name": "read"},
        },
    ],
    "/v1/responses": [
        {
            "model": "gpt-x",
            "instructions": "You are a coding agent.",
            "input": [
                {"role": "developer", "content": "Be brief."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ls will do"}], "content": None},
                {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"command": "ls"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Done.", "annotations": []}]},
                {"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{_PIXEL}"}]},
            ],
            "tools": [
                {"type": "function", "name": "bash", "description": "Run.", "parameters": _PARAMETERS, "strict": False},
                {
                    "type": "namespace",
                    "name": "agents",
                    "description": "Sub-agents.",
                    "tools": [{"type": "function", "name": "close_agent", "parameters": _PARAMETERS}],
                },
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "max_output_tokens": 32,
            "temperature": 0.7,
            "top_p": 0.9,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "text": {"format": {"type": "text"}, "verbosity": "low"},
            "metadata": {"run": "r1"},
            "store": False,
            "truncation": "disabled",
            "include": ["reasoning.encrypted_content"],
        },
        {
            "model": "gpt-x",
            "input": "hi",
            "max_output_tokens": 8,
            "tools": [{"type": "function", "name": "answer", "parameters": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "function", "name": "answer"},
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True}},
        },
    ],
}  # fmt: skip
