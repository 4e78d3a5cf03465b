"""The `anthropic` teacher of `harbor collect`: Anthropic's Messages API, called with the real
`anthropic` SDK, behind an OpenAI-compatible server on 127.0.0.1.

OpenEnv calls Anthropic from its own loop (`AnthropicClient` in openenv 0.10.0's
`openenv/core/llm_client.py`, built by `create_llm_client("anthropic", ...)` in
`openenv/cli/commands/collect.py`). Here the harness owns the loop and talks OpenAI chat completions
to the capture proxy, so the teacher is the proxy's upstream like any engine: this server takes each
chat request, sends it as `messages.create` (streamed, as the SDK wants for long completions), and
answers with the chat completion. The capture proxy records the same OpenAI turns it records for
`--provider openai`, so the episodes come out in one shape whichever provider wrote them.

The translation is OpenEnv's (`_openai_msgs_to_anthropic`, `_mcp_tools_to_anthropic`): system
messages join into `system`, a tool result is a `tool_result` block in a user turn (consecutive ones
share it), an assistant's tool calls are `tool_use` blocks; `max_tokens` is the request's or
`create_llm_client`'s 4096. The key is `--llm-api-key`, else ANTHROPIC_API_KEY, else API_KEY
(OpenEnv's `_PROVIDER_API_KEY_ENVS`); it stays in this process, and the proxy reaches this server with
a per-run token instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from evaluation.errors import ProviderError
from evaluation.scripted import chat_response, serve_teacher

API_KEY_ENVS = ("ANTHROPIC_API_KEY", "API_KEY")
"""Where the key is looked for when --llm-api-key is not given (OpenEnv's order)."""
DEFAULT_MAX_TOKENS = 4096
"""Anthropic requires `max_tokens`; a request without one gets `create_llm_client`'s default."""
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter"}  # fmt: skip
"""Anthropic's `stop_reason` -> OpenAI's `finish_reason`."""


def anthropic_api_key(given: str | None) -> str:
    """The Anthropic key: `given` (--llm-api-key), else the first of API_KEY_ENVS set."""
    for key in (given, *(os.environ.get(name) for name in API_KEY_ENVS)):
        if key:
            return key
    raise ProviderError(
        f"--provider anthropic needs an API key: set {' or '.join(API_KEY_ENVS)}, or pass --llm-api-key"
    )


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _user_blocks(content: Any) -> str | list[dict[str, Any]]:
    """A user message's content: a string stays one; text and image parts become Anthropic blocks."""
    if not isinstance(content, list):
        return content or ""
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if url.startswith("data:") and ";base64," in url:
                media, data = url.removeprefix("data:").split(";base64,", 1)
                blocks.append(
                    {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
                )
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
    return blocks


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def messages_of(chat: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """OpenAI chat messages as (system, Anthropic messages), as OpenEnv's `_openai_msgs_to_anthropic`."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in chat:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text(message.get("content")))
        elif role == "user":
            out.append({"role": "user", "content": _user_blocks(message.get("content"))})
        elif role == "assistant":
            text = _text(message.get("content"))
            calls = message.get("tool_calls") or []
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            blocks += [
                {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                 "input": _arguments(call["function"].get("arguments"))}
                for call in calls
            ]  # fmt: skip
            out.append({"role": "assistant", "content": blocks if calls else text})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id", ""),
                "content": _text(message.get("content")),
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(result)  # Anthropic wants the results of one turn together
            else:
                out.append({"role": "user", "content": [result]})
    return "\n\n".join(s for s in system if s), out


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    return {
        "name": function.get("name", ""),
        "description": function.get("description", ""),
        "input_schema": schema,
    }


def _tool_choice(choice: Any, parallel: bool | None) -> dict[str, Any] | None:
    if isinstance(choice, dict):
        picked: dict[str, Any] = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    elif choice in ("auto", "required", "none"):
        picked = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    elif parallel is False:
        picked = {"type": "auto"}
    else:
        return None
    if parallel is False and picked["type"] != "none":
        picked["disable_parallel_tool_use"] = True
    return picked


def messages_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The `messages.create` arguments for one OpenAI chat completions request."""
    system, messages = messages_of(body.get("messages") or [])
    request: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    if system:
        request["system"] = system
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = body[name]
    if stop := body.get("stop"):
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = [_tool(t) for t in body.get("tools") or [] if t.get("type", "function") == "function"]
    if tools:
        request["tools"] = tools
        if (choice := _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))) is not None:
            request["tool_choice"] = choice
    return request


def chat_completion(message: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Message (as a dict) as the OpenAI chat completion it answers."""
    blocks = message.get("content") or []
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    calls = [
        {"id": b["id"], "type": "function",
         "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}}
        for b in blocks
        if b.get("type") == "tool_use"
    ]  # fmt: skip
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        reply["tool_calls"] = calls
    usage = message.get("usage") or {}
    prompt = sum(
        usage.get(k) or 0 for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    completion = usage.get("output_tokens") or 0
    return {
        "id": message.get("id") or f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": FINISH_REASONS.get(message.get("stop_reason") or "", "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_anthropic_app(client: Any, token: str) -> FastAPI:
    """`client`: an `anthropic.AsyncAnthropic`; `token`: the bearer the capture proxy must send."""
    import anthropic

    app = FastAPI(title="harbor anthropic teacher")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {token}":
            return _error(
                401, "this teacher answers the capture proxy of its own run only", "authentication_error"
            )
        body = await request.json()
        try:
            async with client.messages.stream(**messages_request(body)) as stream:
                message = await stream.get_final_message()
        except anthropic.APIStatusError as exc:
            return _error(exc.status_code, f"Anthropic: {exc.message}", "upstream_error")
        except anthropic.APIConnectionError as exc:
            return _error(502, f"Anthropic unreachable: {exc}", "upstream_error")
        return chat_response(chat_completion(message.model_dump(mode="json")), body)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


@contextlib.asynccontextmanager
async def anthropic_teacher(api_key: str, base_url: str | None = None) -> AsyncIterator[tuple[str, str]]:
    """Serve the teacher on this loop; yields (its OpenAI base URL, the token it wants). `base_url`:
    Anthropic's API (None: the SDK's, https://api.anthropic.com or ANTHROPIC_BASE_URL)."""
    try:
        import anthropic
    except ImportError:
        raise ProviderError(
            "--provider anthropic needs the anthropic package: pip install 'harbor-rl[anthropic]' (or anthropic)"
        ) from None
    token = secrets.token_urlsafe(24)
    client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url)
    try:
        async with serve_teacher(create_anthropic_app(client, token), "anthropic-teacher") as url:
            yield url, token
    finally:
        await client.close()
