"""The `scripted` teacher of `harbor collect`: a model-free policy per built-in environment.

It is an OpenAI-compatible server (chat completions with tool calls, usage, /v1/models) on
127.0.0.1, so a scripted collect run goes through exactly the machinery a real teacher does: the
harness calls the capture proxy with its session key, the proxy calls this server upstream, and every
call is stored as a capture session. Only the "model" is a script:

- `echo` tool offered: echo the phrase the instruction asks for (the text after its last ": "), once.
- `guess` tool offered (the word game): guess the first word of `WORDS` consistent with all feedback
  seen so far; the game's own feedback rule decides consistency, so it always wins within six.
- anything else: answer in plain text that there is no script for these tools (the episode ends).

It returns no token ids or logprobs, as a remote API would not; eval sessions record the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from harbor_server import free_port
from tasks.environments.wordle import WORDS, feedback

SCRIPTED_MODEL = "scripted"
NO_SCRIPT = "The scripted policy has no script for these tools."


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("function", {}).get("name") for t in body.get("tools") or []}


def _calls(messages: list[dict[str, Any]], name: str) -> list[tuple[dict[str, Any], str]]:
    """(arguments, tool output) of every earlier call of tool `name`, in order."""
    outputs = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    found = []
    for m in messages:
        for call in m.get("tool_calls") or []:
            if call["function"]["name"] == name:
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                except json.JSONDecodeError:
                    arguments = {}
                found.append((arguments, outputs.get(call.get("id"), "")))
    return found


def echo_move(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """echo(message=<phrase>) once; afterwards no tool (the episode is over)."""
    if _calls(messages, "echo"):
        return None
    instruction = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    first_line = instruction.strip().splitlines()[0] if instruction.strip() else ""
    return {"message": first_line.rsplit(": ", 1)[-1]}


def wordle_move(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first word consistent with every (guess, feedback) so far; None when the game was won."""
    seen: list[tuple[str, str]] = []
    for arguments, output in _calls(messages, "guess"):
        lines = output.splitlines()
        if len(lines) >= 2 and not output.startswith("Error"):
            seen.append((str(arguments.get("word", "")).lower(), lines[1].replace(" ", "")))
    if any(marks and set(marks) == {"G"} for _, marks in seen):
        return None
    guessed = {g for g, _ in seen}
    for word in WORDS:
        consistent = all(len(g) == len(word) and feedback(g, word) == marks for g, marks in seen)
        if consistent and word not in guessed:
            return {"word": word}
    return None


SCRIPTS = {"echo": echo_move, "guess": wordle_move}


def scripted_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the script sends for this request."""
    messages = body.get("messages") or []
    offered = _tool_names(body)
    for tool, move in SCRIPTS.items():
        if tool in offered:
            arguments = move(messages)
            if arguments is None:
                return {"role": "assistant", "content": "Done."}
            call_id = f"call_{uuid.uuid4().hex[:12]}"
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps(arguments)},
                    }
                ],
            }
    return {"role": "assistant", "content": NO_SCRIPT}


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def create_scripted_app() -> FastAPI:
    app = FastAPI(title="harbor scripted teacher")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse(
                {
                    "error": {
                        "message": "the scripted teacher does not stream",
                        "type": "invalid_request_error",
                    }
                },
                status_code=400,
            )
        message = scripted_reply(body)
        prompt = sum(_approx_tokens(json.dumps(m)) for m in body.get("messages") or [])
        said = message["content"] + "".join(
            c["function"]["arguments"] for c in message.get("tool_calls") or []
        )
        # Usage like an engine's: never more than the max_tokens asked for (loops budget by it).
        completion = min(
            _approx_tokens(said), body.get("max_tokens") or body.get("max_completion_tokens") or 1 << 30
        )
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or SCRIPTED_MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": SCRIPTED_MODEL, "object": "model", "owned_by": "harbor"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


@contextlib.asynccontextmanager
async def scripted_teacher() -> AsyncIterator[str]:
    """Serve the scripted teacher on this loop; yields its OpenAI base URL (…/v1)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_scripted_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    task = asyncio.create_task(server.serve(), name="scripted-teacher")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"the scripted teacher could not serve on 127.0.0.1:{port}")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
