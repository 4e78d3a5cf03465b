"""Server-sent events: split the engine's stream into events, relay each to the agent, assemble the capture.

vLLM streams `data: {chunk}\\n\\n` events and ends with `data: [DONE]`. With `return_token_ids` the first
chunk carries `prompt_token_ids` (chat: top level; completions: per choice) and every chunk its
`token_ids` delta next to its logprobs. The assembler keeps only appends per chunk, so a stream costs
time linear in its own length and nothing else.
"""

from __future__ import annotations

from typing import Any

import orjson

from capture_proxy.upstream import Capture, Endpoint, Wants, check_tokens, token_ids

DONE = b"[DONE]"


class SSEDecoder:
    """Incremental SSE parser: feed it bytes as they arrive, get back the complete events' data payloads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        # The commonest read of a token stream: exactly one whole one-line `data:` event.
        if (
            not self._buf
            and data[-2:] == b"\n\n"
            and data[:5] == b"data:"
            and data.find(b"\n") == len(data) - 2
        ):
            return [data[5:-2].lstrip()]
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2 :]
        lines = buf[:end].split(b"\n")
        # The common case: every event is one `data:` line, so the lines alternate event, blank.
        if len(lines) % 2 and not any(lines[1::2]):
            out = []
            for line in lines[::2]:
                if not line.startswith(b"data:"):
                    break
                out.append(line[5:].lstrip())
            else:
                return out
        out = []
        for event in buf[:end].split(b"\n\n"):
            data = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if data:
                out.append(b"\n".join(data))
        return out

    @property
    def pending(self) -> bool:
        """Bytes of an event that never ended (a stream cut mid-event)."""
        return bool(self._buf.strip())


def _text(piece: Any) -> str:
    """A piece of the completion's text: a string, or the event is malformed (TypeError, which `relay`
    makes a transport failure), never a value that breaks the reply merged from the pieces later."""
    if type(piece) is not str:
        raise TypeError(f"expected a string, got {type(piece).__name__}")
    return piece


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
        self._capture: Capture | None = None

    def relay(self, payloads: list[bytes]) -> bytes:
        """Absorb a batch of event payloads; return the SSE bytes to send the agent (without [DONE])."""
        out = []
        for payload in payloads:
            if payload == DONE:
                try:  # checked here, where a malformed stream is still a transport failure
                    self._capture = self.capture()
                except TypeError as exc:
                    raise ValueError(str(exc)) from exc
                self.done = True
                break
            chunk = orjson.loads(payload)
            if not isinstance(chunk, dict):
                raise ValueError(f"engine sent a non-object stream event: {payload[:200]!r}")
            if "error" in chunk:
                # vLLM's mid-stream failure; only [DONE] follows it.
                self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk)}
                out.append(orjson.dumps(chunk))
                break
            try:
                changed = self._absorb(chunk)
            except (KeyError, IndexError, TypeError, AttributeError) as exc:
                # Valid JSON of the wrong shape: the same transport failure as unparsable bytes.
                raise ValueError(
                    f"engine sent a malformed stream event ({exc!r}): {payload[:200]!r}"
                ) from exc
            # An event the agent gets as the engine sent it is relayed as its own bytes (one line).
            out.append(orjson.dumps(chunk) if changed or b"\n" in payload else payload)
        if not out:
            return b""
        return b"data: " + b"\n\ndata: ".join(out) + b"\n\n"

    def _absorb(self, chunk: dict) -> bool:
        """Take in one chunk, stripping it for the agent in place; whether anything was stripped."""
        # Runs once per token: dict lookups kept to what each chunk needs.
        self.chunks += 1
        changed = False
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        keep_ids = self.wants.token_ids
        chat = self.endpoint == "chat"
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        if "prompt_token_ids" in chunk:
            ids = chunk["prompt_token_ids"] if keep_ids else chunk.pop("prompt_token_ids")
            changed |= not keep_ids
            if ids is not None:
                self.prompt_ids = ids
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if "prompt_token_ids" in choice:
                ids = choice["prompt_token_ids"] if keep_ids else choice.pop("prompt_token_ids")
                changed |= not keep_ids
                if ids is not None:
                    self.prompt_ids = ids
            if keep_ids:
                ids = choice.get("token_ids")
            else:
                changed |= "token_ids" in choice
                ids = choice.pop("token_ids", None)
            if ids is not None:
                self.completion_ids += ids
                self.saw_token_ids = True
            lp = choice.get("logprobs")
            if lp:
                content = lp.get("content") if chat else None
                if content is not None:  # chat, inline: it runs once per token
                    self.saw_logprobs = True
                    for c in content:
                        self.tokens.append(c["token"])
                        self.logps.append(c["logprob"])
                elif not chat:
                    self._absorb_completion_logprobs(lp)
                if not self.wants.logprobs:
                    choice["logprobs"] = None
                    changed = True
            finish = choice.get("finish_reason")
            if finish:
                self.finish_reason = finish
            if chat:
                delta = choice.get("delta")
                if delta:
                    content = delta.get("content")
                    if content:
                        self.text.append(_text(content))
                    if "reasoning" in delta or "tool_calls" in delta:
                        self._absorb_delta(delta)
            else:
                text = choice.get("text")
                if text:
                    self.text.append(_text(text))
        return changed

    def _absorb_completion_logprobs(self, lp: dict) -> None:
        if lp.get("token_logprobs") is not None:
            self.saw_logprobs = True
            self.tokens.extend(lp.get("tokens") or ())
            self.logps.extend(lp["token_logprobs"])

    def _absorb_delta(self, delta: dict) -> None:
        """The rarer parts of a chat delta: reasoning text and tool-call pieces."""
        if delta.get("reasoning"):
            self.reasoning.append(_text(delta["reasoning"]))
        if "tool_calls" not in delta:
            return
        for tc in delta["tool_calls"] or ():
            slot = self.tool_calls.setdefault(
                tc.get("index", 0), {"id": None, "type": "function", "name": "", "arguments": []}
            )
            if tc.get("id"):
                slot["id"] = _text(tc["id"])
            fn = tc.get("function") or {}
            if fn.get("name"):
                slot["name"] = _text(fn["name"])
            if fn.get("arguments"):
                slot["arguments"].append(_text(fn["arguments"]))

    def capture(self) -> Capture:
        if self._capture is not None:
            return self._capture
        self.prompt_ids = token_ids(self.prompt_ids, "prompt_token_ids")  # checked, packed once
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
