"""The `scripted` teacher of `harbor collect`: a model-free policy per built-in environment.

It is an OpenAI-compatible server (chat completions with tool calls, usage, /v1/models) on
127.0.0.1, so a scripted collect run goes through exactly the machinery a real teacher does: the
harness calls the capture proxy with its session key, the proxy calls this server upstream, and every
call is stored as a capture session. Only the "model" is a script:

- `echo` tool offered: echo the phrase the instruction asks for (the text after its last ": "), once.
- `guess` tool offered (the word game): guess the first word of `WORDS` consistent with all feedback
  seen so far; the game's own feedback rule decides consistency, so it always wins within six.
- `play_move` tool offered (an OpenSpiel game, `tasks.environments.openspiel`): the first legal action
  of the latest observation, as OpenEnv's scripted teacher plays (`openenv collect --provider scripted`,
  `_build_scripted_model_step` and `_extract_legal_actions` of `openenv/cli/commands/collect.py`,
  openenv 0.10.0): the last message holding `legal_actions` (a move's JSON result, or the first
  prompt's `Legal actions: [...]`); no move once the game is over.
- `bash` offered (a coding harness: mini-swe-agent, opencode): play the task's `solution/solve.sh` as
  the harness's own tool calls (`evaluation.scripted_coding`), when the run gave it the tasks.
- anything else: answer in plain text that there is no script for these tools (the episode ends).

It answers streamed requests with a real SSE stream (opencode streams every call), in one content
chunk. It returns no token ids or logprobs, as a remote API would not; eval sessions record the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from evaluation.scripted_coding import BASH, CodingScripts
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
            seen.append((str(arguments.get("guess", "")).lower(), lines[1].replace(" ", "")))
    if any(marks and set(marks) == {"G"} for _, marks in seen):
        return None
    guessed = {g for g, _ in seen}
    for word in WORDS:
        consistent = all(len(g) == len(word) and feedback(g, word) == marks for g, marks in seen)
        if consistent and word not in guessed:
            return {"guess": word}
    return None


_LEGAL_ACTIONS_RE = re.compile(r"Legal actions:\s*\[([^\]]*)\]")


def _legal_actions(content: str) -> list[int] | None:
    """The `legal_actions` a message shows (its JSON's, else a `Legal actions: [...]` line); None: none."""
    try:
        payload = json.loads(content)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("legal_actions"), list):
        return [int(a) for a in payload["legal_actions"]]
    if match := _LEGAL_ACTIONS_RE.search(content):
        return [int(a) for a in match.group(1).split(",") if a.strip()]
    return None


def openspiel_move(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """play_move(action_id=<the first legal action>) of the latest observation; None when it has none."""
    for message in reversed(messages):
        legal = _legal_actions(_text(message.get("content")))
        if legal is not None:
            return {"action_id": legal[0]} if legal else None
    return None


SCRIPTS = {"echo": echo_move, "guess": wordle_move, "play_move": openspiel_move}


def scripted_reply(body: dict[str, Any], coding: CodingScripts | None = None) -> dict[str, Any]:
    """The assistant message the script sends for this request."""
    messages = body.get("messages") or []
    offered = _tool_names(body)
    for tool, move in SCRIPTS.items():
        if tool in offered:
            return _tool_call_or_done(tool, move(messages))
    if BASH in offered and coding is not None:
        return _tool_call_or_done(BASH, coding.move(body))
    return {"role": "assistant", "content": NO_SCRIPT}


def _tool_call_or_done(tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
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


def chat_response(reply: dict[str, Any], body: dict[str, Any]) -> Response:
    """A chat.completion `reply` as the request `body` asked for it: JSON, or an SSE stream of chunks."""
    return _sse(_stream_chunks(reply, body)) if body.get("stream") else JSONResponse(reply)


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def _stream_chunks(reply: dict[str, Any], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The reply as OpenAI's chat.completion.chunk sequence: the whole message in one delta, the
    finish reason, and the usage chunk when `stream_options.include_usage` asks for it."""
    choice = reply["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        head | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(head | {"choices": [], "usage": reply["usage"]})
    return chunks


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def create_scripted_app(coding: CodingScripts | None = None) -> FastAPI:
    """`coding`: the solutions of the coding tasks this run may meet (None: white-box scripts only)."""
    app = FastAPI(title="harbor scripted teacher")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        return chat_response(_completion(body, coding), body)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": SCRIPTED_MODEL, "object": "model", "owned_by": "harbor"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _completion(body: dict[str, Any], coding: CodingScripts | None) -> dict[str, Any]:
    message = scripted_reply(body, coding)
    prompt = sum(_approx_tokens(json.dumps(m)) for m in body.get("messages") or [])
    said = message["content"] + "".join(c["function"]["arguments"] for c in message.get("tool_calls") or [])
    # Usage like an engine's: never more than the max_tokens asked for (loops budget by it).
    completion = min(
        _approx_tokens(said), body.get("max_tokens") or body.get("max_completion_tokens") or 1 << 30
    )
    return {
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


@contextlib.asynccontextmanager
async def scripted_teacher(coding: CodingScripts | None = None) -> AsyncIterator[str]:
    """Serve the scripted teacher on this loop; yields its OpenAI base URL (…/v1)."""
    async with serve_teacher(create_scripted_app(coding), "scripted-teacher") as url:
        yield url


@contextlib.asynccontextmanager
async def serve_teacher(app: FastAPI, name: str) -> AsyncIterator[str]:
    """Serve `app` (an OpenAI-compatible teacher) on a free 127.0.0.1 port on this loop; yields its
    OpenAI base URL (…/v1)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve(), name=name)
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"the {name} could not serve on 127.0.0.1:{port}")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
