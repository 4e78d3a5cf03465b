"""The request of OpenAI's Responses API as the proxy reads it (`openai.types.responses.ResponseCreateParams`):
each field the translation uses or the reply echoes, typed, so a body that does not fit is refused
naming its field.

Input items are told apart by `type`; an item without one is a message when it has a `role`, as the
API reads it. Items, content parts and tools of any other type (a hosted tool, a file, an item
reference) are kinds the engine cannot serve, refused as such.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from capture_proxy.dialects.shapes import NonEmptyStr, PositiveInt, Shape, ToolSchema, tagged


class TextPart(Shape):
    type: Literal["input_text", "output_text", "text"]
    text: str


class RefusalPart(Shape):
    type: Literal["refusal"]
    refusal: str


class ImagePart(Shape):
    """An image by URL (or data URL): a file id names a file on OpenAI's side, which no engine has."""

    type: Literal["input_image"]
    image_url: str


Part = tagged(TextPart, RefusalPart, ImagePart, unsupported="a content part of type")
OutputPart = tagged(TextPart, RefusalPart, unsupported="a content part of type")


class MessageItem(Shape):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]  # type: ignore[valid-type]


class FunctionCallItem(Shape):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutputItem(Shape):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[OutputPart]  # type: ignore[valid-type]


class ReasoningText(Shape):
    text: str


class ReasoningItem(Shape):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None


Item = tagged(
    MessageItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ReasoningItem,
    unsupported="an input item of type",
    default=lambda item: "message" if "role" in item else None,
)


class FunctionTool(Shape):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: ToolSchema | None = None
    strict: bool | None = None


class NamespaceTool(Shape):
    """A named group of functions, as codex sends its sub-agent tools; the engine sees the functions."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[tagged(FunctionTool, unsupported="the tool type")]  # type: ignore[valid-type]


Tool = tagged(FunctionTool, NamespaceTool, unsupported="the tool type")


class FunctionChoice(Shape):
    type: Literal["function"]
    name: str


class TextFormat(Shape):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(Shape):
    format: tagged(TextFormat, unsupported="the text format") | None = None  # type: ignore[valid-type]


class Reasoning(Shape):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(Shape):
    model: NonEmptyStr
    input: str | list[Item]  # type: ignore[valid-type]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    tools: list[Tool] | None = None  # type: ignore[valid-type]
    tool_choice: (
        Literal["auto", "none", "required"]
        | tagged(  # type: ignore[valid-type]
            FunctionChoice, unsupported="the tool_choice of type"
        )
        | None
    ) = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = None
    # Refused when set: they need state only OpenAI's servers keep.
    previous_response_id: Any = None
    conversation: Any = None
    background: Any = None
    prompt: Any = None
