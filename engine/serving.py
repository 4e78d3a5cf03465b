"""Chat and text completions in vLLM's dialect, non-streamed and streamed (vLLM's serving_chat and
serving_completion, for the batching loop of `scheduler`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import Response, StreamingResponse

from engine import chat, protocol
from engine.config import EngineState
from engine.errors import BadRequest, EngineError
from engine.protocol import POLICY_VERSION_HEADER, ChatRequest, CompletionRequest
from engine.sampling import SamplingSettings
from engine.sampling_params import sampling_settings
from engine.scheduler import BatchScheduler, Sequence, TokenEvent


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


# ---- generation helpers -------------------------------------------------------------------------


async def _run_to_end(scheduler: BatchScheduler, seq: Sequence) -> list[TokenEvent]:
    events: list[TokenEvent] = []
    try:
        while True:
            event = await seq.queue.get()
            events.append(event)
            if event.finish_reason is not None:
                break
    finally:
        if not seq.finished:
            scheduler.cancel(seq)
    if events[-1].finish_reason == "error":
        raise EngineError(events[-1].text)
    return events


async def _generate(state: EngineState, prompt_ids: list[int], settings: SamplingSettings, n: int):
    """Run `n` sequences of one prompt; returns [(sequence, events)] in choice order."""
    loop = asyncio.get_running_loop()
    seqs = []
    for i in range(n):
        seed = None if settings.seed is None else settings.seed + i
        seq = Sequence(list(prompt_ids), _with_seed(settings, seed), loop)
        state.scheduler.submit(seq)
        seqs.append(seq)
    results = await asyncio.gather(*(_run_to_end(state.scheduler, s) for s in seqs))
    return list(zip(seqs, results, strict=True))


def _with_seed(settings: SamplingSettings, seed: int | None) -> SamplingSettings:
    return dataclasses.replace(settings, seed=seed)


def _version_of(seqs: list[Sequence], state: EngineState) -> str:
    """The weight tag the request's first sequence was admitted under (sequences of one request are
    admitted in submission order; tags are names, so there is no "oldest" to take)."""
    versions = [s.version for s in seqs if s.version is not None]
    return versions[0] if versions else state.scheduler.weight_version


class _DeltaText:
    """Turns the growing completion text into stream deltas, holding back what may still change:
    an incomplete UTF-8 character, the head of a stop string, and anything after `<tool_call>`."""

    def __init__(self, settings: SamplingSettings, hide_tool_calls: bool) -> None:
        self.sent = 0
        self.hold = max((len(s) for s in settings.stop), default=1) - 1
        self.hide_tool_calls = hide_tool_calls

    def delta(self, text: str, final: bool, reveal: bool = False) -> str:
        if self.hide_tool_calls and not reveal and chat.TOOL_CALL_START in text:
            text = text[: text.find(chat.TOOL_CALL_START)]
        elif not final:
            text = text[: len(text) - self.hold] if self.hold else text
            if text.endswith("\ufffd"):
                text = text[:-1]
        out = text[self.sent :] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return out


# ---- chat ---------------------------------------------------------------------------------------


def _chat_prompt(state: EngineState, req: ChatRequest) -> tuple[list[int], bool]:
    """Render and tokenize the chat prompt; returns (prompt ids, whether to parse tool calls)."""
    messages = chat.normalize_messages(req.messages)
    tools = chat.validate_tools(req.tools)
    choice = req.tool_choice
    if choice not in (None, "auto", "none"):
        raise BadRequest(
            f"tool_choice={choice!r} is not supported by the embedded engine (it has no guided decoding); "
            "use 'auto' or 'none'",
            param="tool_choice",
        )
    try:
        text = state.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            continue_final_message=req.continue_final_message,
            tokenize=False,
            **(req.chat_template_kwargs or {}),
        )
    except Exception as exc:  # jinja raises many types; all mean the messages do not fit the template
        raise BadRequest(
            f"cannot apply the chat template to these messages: {exc}", param="messages"
        ) from None
    return state.tokenizer.encode(text, add_special_tokens=False), bool(tools) and choice != "none"


async def chat_completion(state: EngineState, req: ChatRequest) -> Response:
    state.check_model(req.model)
    prompt_ids, parse_tools = _chat_prompt(state, req)
    if req.top_logprobs and not req.logprobs:
        raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    settings = sampling_settings(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=state.max_model_len,
        defaults=state.defaults,
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        num_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
    )
    if req.stream:
        return await _chat_stream(state, req, prompt_ids, settings, parse_tools)
    results = await _generate(state, prompt_ids, settings, req.n)
    choices = []
    for index, (_, events) in enumerate(results):
        last = events[-1]
        content, tool_calls = chat.parse_tool_calls(last.text) if parse_tools else (last.text, [])
        sampled = [e for e in events if e.token_id is not None]
        choice: dict[str, Any] = {
            "index": index,
            "message": {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "tool_calls": tool_calls,
                "reasoning_content": None,
            },
            "logprobs": None
            if settings.logprobs is None
            else {"content": [state.namer.chat_entry(e.token_id, e.logprob, e.top) for e in sampled]},
            "finish_reason": "tool_calls" if tool_calls else last.finish_reason,
            "stop_reason": last.stop_reason,
        }
        if req.return_token_ids:
            choice["token_ids"] = [e.token_id for e in sampled]
        choices.append(choice)
    completion_tokens = sum(len(s.generated) for s, _ in results)
    body: dict[str, Any] = {
        "id": protocol.new_id("chatcmpl"),
        "object": "chat.completion",
        "created": protocol.now(),
        "model": state.served_name,
        "choices": choices,
        "usage": protocol.usage(len(prompt_ids), completion_tokens),
        "prompt_logprobs": None,
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    version = _version_of([s for s, _ in results], state)
    return Response(
        orjson.dumps(body), media_type="application/json", headers={POLICY_VERSION_HEADER: version}
    )


async def _admit(state: EngineState, prompt_ids: list[int], settings: SamplingSettings, n: int):
    """Submit a streaming request and wait for its first event (so its weight version is known)."""
    if n != 1:
        raise BadRequest("n > 1 is not supported with stream=true by the embedded engine", param="n")
    seq = Sequence(list(prompt_ids), settings, asyncio.get_running_loop())
    state.scheduler.submit(seq)
    try:
        first = await seq.queue.get()
    except BaseException:
        state.scheduler.cancel(seq)
        raise
    if first.finish_reason == "error":
        raise EngineError(first.text)
    return seq, first


async def _events(state: EngineState, seq: Sequence, first: TokenEvent) -> AsyncIterator[TokenEvent]:
    event = first
    try:
        while True:
            yield event
            if event.finish_reason is not None:
                return
            event = await seq.queue.get()
    finally:
        if not seq.finished:
            state.scheduler.cancel(seq)


async def _chat_stream(state, req: ChatRequest, prompt_ids, settings, parse_tools: bool) -> Response:
    seq, first = await _admit(state, prompt_ids, settings, req.n)
    head = {
        "id": protocol.new_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": protocol.now(),
        "model": state.served_name,
    }
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    texts = _DeltaText(settings, hide_tool_calls=parse_tools)

    async def body() -> AsyncIterator[bytes]:
        opening = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if req.return_token_ids:
            opening["prompt_token_ids"] = prompt_ids
        yield _sse(opening)
        async for event in _events(state, seq, first):
            if event.finish_reason == "error":
                yield _sse(protocol.error_body(event.text, "InternalServerError", 500))
                break
            final = event.finish_reason is not None
            delta: dict[str, Any] = {}
            finish = event.finish_reason
            calls: list[dict[str, Any]] = []
            if final and parse_tools:
                _, calls = chat.parse_tool_calls(event.text)
            # A final output without parsable calls releases any held-back `<tool_call>` text as content.
            text_delta = texts.delta(event.text, final, reveal=final and not calls)
            if calls:
                finish = "tool_calls"
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            if text_delta:
                delta["content"] = text_delta
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if final:
                choice["stop_reason"] = event.stop_reason
            if event.token_id is not None:
                if settings.logprobs is not None:
                    choice["logprobs"] = {
                        "content": [state.namer.chat_entry(event.token_id, event.logprob, event.top)]
                    }
                if req.return_token_ids:
                    choice["token_ids"] = [event.token_id]
            yield _sse({**head, "choices": [choice]})
        if include_usage:
            yield _sse({**head, "choices": [], "usage": protocol.usage(len(prompt_ids), len(seq.generated))})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={POLICY_VERSION_HEADER: str(seq.version)}
    )


# ---- completions --------------------------------------------------------------------------------


def _completion_prompt(state: EngineState, prompt: Any) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise BadRequest(
                "batched prompts are not supported by the embedded engine: send one prompt per request",
                param="prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = state.tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        vocab = len(state.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"Token id {bad[0]} is out of vocabulary (size {vocab})", param="prompt")
    if not ids:
        raise BadRequest("The prompt cannot be empty", param="prompt")
    return ids


async def completion(state: EngineState, req: CompletionRequest) -> Response:
    state.check_model(req.model)
    if req.echo:
        raise BadRequest("echo=true is not supported by the embedded engine", param="echo")
    prompt_ids = _completion_prompt(state, req.prompt)
    settings = sampling_settings(
        req,
        prompt_len=len(prompt_ids),
        max_model_len=state.max_model_len,
        defaults=state.defaults,
        max_tokens=req.max_tokens,
        num_logprobs=req.logprobs,
    )
    if req.stream:
        return await _completion_stream(state, req, prompt_ids, settings)
    results = await _generate(state, prompt_ids, settings, req.n)
    choices = []
    for index, (_, events) in enumerate(results):
        last = events[-1]
        sampled = [e for e in events if e.token_id is not None]
        choices.append(
            {
                "index": index,
                "text": last.text,
                "logprobs": None
                if settings.logprobs is None
                else state.namer.completion_logprobs([(e.token_id, e.logprob, e.top) for e in sampled], 0),
                "finish_reason": last.finish_reason,
                "stop_reason": last.stop_reason,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt_ids if req.return_token_ids else None,
                "token_ids": [e.token_id for e in sampled] if req.return_token_ids else None,
            }
        )
    body = {
        "id": protocol.new_id("cmpl"),
        "object": "text_completion",
        "created": protocol.now(),
        "model": state.served_name,
        "choices": choices,
        "usage": protocol.usage(len(prompt_ids), sum(len(s.generated) for s, _ in results)),
    }
    version = _version_of([s for s, _ in results], state)
    return Response(
        orjson.dumps(body), media_type="application/json", headers={POLICY_VERSION_HEADER: version}
    )


async def _completion_stream(state, req: CompletionRequest, prompt_ids, settings) -> Response:
    seq, first = await _admit(state, prompt_ids, settings, req.n)
    head = {
        "id": protocol.new_id("cmpl"),
        "object": "text_completion",
        "created": protocol.now(),
        "model": state.served_name,
    }
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    texts = _DeltaText(settings, hide_tool_calls=False)

    async def body() -> AsyncIterator[bytes]:
        offset = 0
        async for event in _events(state, seq, first):
            if event.finish_reason == "error":
                yield _sse(protocol.error_body(event.text, "InternalServerError", 500))
                break
            text = texts.delta(event.text, event.finish_reason is not None)
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": event.finish_reason,
                "stop_reason": event.stop_reason,
            }
            if event.token_id is not None:
                if settings.logprobs is not None:
                    choice["logprobs"] = state.namer.completion_logprobs(
                        [(event.token_id, event.logprob, event.top)], offset
                    )
                if req.return_token_ids:
                    choice["token_ids"] = [event.token_id]
                    if event is first:
                        choice["prompt_token_ids"] = prompt_ids
            offset += len(text)
            yield _sse({**head, "choices": [choice]})
        if include_usage:
            yield _sse({**head, "choices": [], "usage": protocol.usage(len(prompt_ids), len(seq.generated))})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={POLICY_VERSION_HEADER: str(seq.version)}
    )
