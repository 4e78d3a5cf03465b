"""Server-sent events: split the engine's stream into events, relay each to the agent, assemble the capture.

vLLM streams `data: {chunk}\\n\\n` events and ends with `data: [DONE]`. With `return_token_ids` the first
chunk carries `prompt_token_ids` (chat: top level; completions: per choice) and every chunk its
`token_ids` delta next to its logprobs. The assembler keeps only appends per chunk, so a stream costs
time linear in its own length and nothing else.
"""

from __future__ import annotations

from typing import Any

import orjson

from capture_proxy.upstream import Capture, Endpoint, Wants, check_tokens

DONE = b"[DONE]"


class SSEDecoder:
    """Incremental SSE parser: feed it bytes as they arrive, get back the complete events' data payloads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        out = []
        for event in events:
            if event.startswith(b"data:") and b"\n" not in event:  # the common case: one data line
                out.append(event[5:].lstrip())
                continue
            lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(lines))
        return out

    @property
    def pending(self) -> bool:
        """Bytes of an event that never ended (a stream cut mid-event)."""
        return bool(self._buf.strip())


class StreamAssembler:
    """Builds the turn from the chunks of one streamed completion and strips them for the agent."""

    def __init__(self, endpoint: Endpoint, wants: Wants):
        self.endpoint = endpoint
        self.wants = wants
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] = []
        self.saw_token_ids = False
        self.tokens: list[str] = []
        self.logps: list[Any] = []
        self.saw_logprobs = False
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.error: dict | None = None
        self.done = False
        self.head: dict = {}
        self.chunks = 0

    def relay(self, payloads: list[bytes]) -> bytes:
        """Absorb a batch of event payloads; return the SSE bytes to send the agent (without [DONE])."""
        out = []
        for payload in payloads:
            if payload == DONE:
                self.done = True
                break
            chunk = orjson.loads(payload)
            if not isinstance(chunk, dict):
                raise ValueError(f"engine sent a non-object stream event: {payload[:200]!r}")
            if "error" in chunk:
                # vLLM's mid-stream failure; only [DONE] follows it.
                self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk)}
                out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
                break
            self._absorb(chunk)
            out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
        return b"".join(out)

    def _absorb(self, chunk: dict) -> None:
        self.chunks += 1
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        wants = self.wants
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if "prompt_token_ids" in chunk:
            if chunk["prompt_token_ids"] is not None:
                self.prompt_ids = chunk["prompt_token_ids"]
            if not wants.token_ids:
                del chunk["prompt_token_ids"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if "prompt_token_ids" in choice:
                if choice["prompt_token_ids"] is not None:
                    self.prompt_ids = choice["prompt_token_ids"]
                if not wants.token_ids:
                    del choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if ids is not None:
                self.completion_ids.extend(ids)
                self.saw_token_ids = True
            if not wants.token_ids:
                choice.pop("token_ids", None)
            lp = choice.get("logprobs")
            if lp:
                self._absorb_logprobs(lp)
                if not wants.logprobs:
                    choice["logprobs"] = None
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if self.endpoint == "chat":
                self._absorb_delta(choice.get("delta") or {})
            elif choice.get("text"):
                self.text.append(choice["text"])

    def _absorb_logprobs(self, lp: dict) -> None:
        if self.endpoint == "chat":
            content = lp.get("content")
            if content is not None:
                self.saw_logprobs = True
                for c in content:
                    self.tokens.append(c["token"])
                    self.logps.append(c["logprob"])
        elif lp.get("token_logprobs") is not None:
            self.saw_logprobs = True
            self.tokens.extend(lp.get("tokens") or ())
            self.logps.extend(lp["token_logprobs"])

    def _absorb_delta(self, delta: dict) -> None:
        if delta.get("content"):
            self.text.append(delta["content"])
        if delta.get("reasoning"):
            self.reasoning.append(delta["reasoning"])
        for tc in delta.get("tool_calls") or ():
            slot = self.tool_calls.setdefault(
                tc.get("index", 0), {"id": None, "type": "function", "name": "", "arguments": []}
            )
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            if fn.get("name"):
                slot["name"] = fn["name"]
            if fn.get("arguments"):
                slot["arguments"].append(fn["arguments"])

    def capture(self) -> Capture:
        status, error = check_tokens(
            self.prompt_ids,
            self.completion_ids if self.saw_token_ids else None,
            self.tokens,
            self.logps if self.saw_logprobs else None,
        )
        return Capture(
            self.prompt_ids or [], self.completion_ids, self.logps, status, error, self.finish_reason
        )

    def response(self) -> dict:
        """The completion the agent received, merged from its chunks (the shape of a non-streamed reply)."""
        text = "".join(self.text)
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self.reasoning:
                message["reasoning"] = "".join(self.reasoning)
            if self.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": s["id"],
                        "type": s["type"],
                        "function": {"name": s["name"], "arguments": "".join(s["arguments"])},
                    }
                    for _, s in sorted(self.tool_calls.items())
                ]
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": self.finish_reason}
            obj = "text_completion"
        return {**self.head, "object": obj, "choices": [choice], "usage": self.usage}
