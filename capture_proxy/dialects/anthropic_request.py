"""The request of Anthropic's Messages API as the proxy reads it (`anthropic.types.MessageCreateParams`):
each field the translation uses, typed, so a body that does not fit is refused naming its field.

The content blocks each role may hold are the union of that role's message: a user turn holds text,
images and tool results; an assistant turn text, tool calls and thinking. A block of any other type
(a document, a server tool's result) is a kind the engine cannot serve, refused as such.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from capture_proxy.dialects.shapes import Int64, NonEmptyStr, PositiveInt, Shape, ToolSchema, tagged


class TextBlock(Shape):
    type: Literal["text"]
    text: str


class Base64Source(Shape):
    type: Literal["base64"]
    media_type: str = "image/png"
    data: str


class UrlSource(Shape):
    type: Literal["url"]
    url: str


class ImageBlock(Shape):
    type: Literal["image"]
    source: tagged(Base64Source, UrlSource, unsupported="an image source of type")  # type: ignore[valid-type]


class ToolUseBlock(Shape):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = {}


class ThinkingBlock(Shape):
    type: Literal["thinking"]
    thinking: str


class RedactedThinkingBlock(Shape):
    """Encrypted by Anthropic's servers: no engine wrote it, none can read it; dropped."""

    type: Literal["redacted_thinking"]


ResultContent = tagged(TextBlock, ImageBlock, unsupported="a tool_result block of type")


class ToolResultBlock(Shape):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultContent] | None = None  # type: ignore[valid-type]


UserBlock = tagged(TextBlock, ImageBlock, ToolResultBlock, unsupported="a user content block of type")
AssistantBlock = tagged(
    TextBlock,
    ToolUseBlock,
    ThinkingBlock,
    RedactedThinkingBlock,
    unsupported="an assistant content block of type",
)
SystemBlocks = list[tagged(TextBlock, unsupported="a system block of type")]  # type: ignore[misc]


class UserMessage(Shape):
    role: Literal["user"]
    content: str | list[UserBlock]  # type: ignore[valid-type]


class AssistantMessage(Shape):
    role: Literal["assistant"]
    content: str | list[AssistantBlock]  # type: ignore[valid-type]


class SystemMessage(Shape):
    """Claude Code sends its environment notes so, after the first prompt."""

    role: Literal["system"]
    content: str | SystemBlocks  # type: ignore[valid-type]


Message = tagged(UserMessage, AssistantMessage, SystemMessage, key="role")


class CustomTool(Shape):
    """A tool the agent runs itself; a tool of any other `type` (web search, code execution, Anthropic's
    bash or editor) is a server tool that runs on Anthropic's side."""

    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: ToolSchema | None = None


Tool = tagged(CustomTool, unsupported="the server tool", default=lambda tool: "custom")


class ToolChoice(Shape):
    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: bool | None = None


class NamedToolChoice(Shape):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class Thinking(Shape):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Int64 | None = None


class MessagesRequest(Shape):
    model: NonEmptyStr
    max_tokens: PositiveInt
    messages: Annotated[list[Message], Field(min_length=1)]  # type: ignore[valid-type]
    system: str | SystemBlocks | None = None  # type: ignore[valid-type]
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    stop_sequences: list[str] | None = None
    tools: list[Tool] | None = None  # type: ignore[valid-type]
    tool_choice: tagged(ToolChoice, NamedToolChoice) | None = None  # type: ignore[valid-type]
    thinking: Thinking | None = None
    stream: bool | None = None
