"""A faithful local imitation of vLLM's OpenAI server, for tests and benchmarks where no GPU runs vLLM.

It speaks the wire protocol of vLLM >= 0.22 (the shapes `engine.protocol` defines for the embedded
engine too) as `vllm/entrypoints/openai/chat_completion/protocol.py`
and its serving code produce it: top-level `prompt_token_ids` and per-choice `token_ids` when asked for
`return_token_ids`, logprobs whose `token` reads `token_id:N` (the server's
`--return-tokens-as-token-ids`), hermes-style tool calls, streamed chunks whose first carries the prompt
ids and every later one its token-id delta, the trailing usage chunk of `stream_options.include_usage`,
`data: [DONE]`, and `{"error": {...}}` bodies; `n` choices, `stop` strings and `stop_token_ids` with
vLLM's `stop_reason`, completion top logprobs, vLLM's 400s for bad sampling values (checked against the
live server by tests/vllm_live/test_sampling_points.py); and vLLM's RL control routes with their status
codes and pause behaviour per release (`_add_rl_routes`; checked against both releases' own route code by
`tests/engine/test_vllm_conformance.py`). It can also send the policy version header the embedded
engine sends (`x-policy-version`); `policy_version=None` sends none, as vLLM.

The "model" is a byte-level tokenizer (id = byte + 3; 1 = <|im_start|>, 2 = <|im_end|>, the EOS)
with a chat template, and a deterministic sampler; so later prompts extend earlier prompt+completion ids
exactly as a real chat template does, and a test can predict every id and logprob. With
`bytes_per_token` k > 1 (benchmarks) each k bytes of a message's text are one id of a ~150k vocabulary,
as a real BPE tokenizer's ~4 bytes a token and 6-digit ids make a prompt's size and its JSON.

Knobs (latency, completion length, failure injection) live in `ImitationSettings`, changeable at run
time through `POST /imitation/settings`; `GET /imitation/requests` returns the bodies it received.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
import zlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import orjson
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from engine.protocol import (
    MAX_TOP_LOGPROBS,
    POLICY_VERSION_HEADER,
    VLLM_ONLY_FIELDS,
    effective_temperature,
    error_body,
    new_id,
    now,
    token_id_string,
    usage,
)

IM_START, IM_END = 1, 2
BYTE_OFFSET = 3
VOCAB_SIZE = 256 + BYTE_OFFSET

Failure = Literal[
    "http_500", "http_400", "cut", "hang", "no_token_ids", "no_logprobs", "token_mismatch", "stream_error"
]

_WORDS = (
    b"the agent reads a file then runs the tests and fixes the bug in the parser before it stops ".split()
)


class ImitationSettings(BaseModel):
    """How the imitation answers. Every field can be changed on a running server."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = "imitation-model"
    """The served model name (reported in replies and by /v1/models)."""
    prompt_tokens: int | None = None
    """Fixed prompt length in tokens (benchmarks); None encodes the messages with the chat template."""
    bytes_per_token: int = Field(1, ge=1, le=16)
    """Bytes of text per token (benchmarks): 1 is the byte-level tokenizer tests predict; k > 1 hashes
    each k bytes of a message's text (and of a completion) into one id of a larger vocabulary, keeping
    every later prompt an extension of the earlier prompt + completion."""
    completion_tokens: int = 16
    """Tokens per completion, EOS included, unless `max_tokens` stops it first (finish_reason length)."""
    excluded_tools: list[str] = Field(default_factory=list)
    """Tools never called, unless nothing else is offered or `tool_choice` names one (a test keeps Claude
    Code off ToolSearch, which changes the request's tool list from then on)."""
    latency_s: float = 0.0
    """Seconds before the first token (prefill)."""
    token_latency_s: float = 0.0
    """Seconds between streamed tokens."""
    token_id_strings: bool = True
    """Logprob tokens read `token_id:N` as with vLLM's --return-tokens-as-token-ids."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """vLLM's --logprobs-mode: processed top-logprob alternatives spread apart as the temperature falls,
    raw ones do not (what harbor serve's engine probe tells apart)."""
    policy_version: int | None = 0
    """Sent as the `x-policy-version` header; None sends no header."""
    fail: Failure | None = None
    """Failure to inject into every request while set."""
    fail_after_chunks: int = 0
    """For `cut` and `stream_error` on streams: events sent before the failure."""
    hang_s: float = 30.0
    """How long `hang` waits before answering."""
    tool_arguments: str | None = None
    """Arguments text of every tool call, verbatim (e.g. broken JSON, as models and some tool parsers
    let through); None: a valid JSON object built from the tool's schema."""
    api_key: str | None = None
    """Refuse calls that do not carry this key (401), as `vllm serve --api-key` does."""
    api_key_header: str = "authorization"
    """Where the key must be: `authorization` as `Bearer <key>` (vLLM's), or a header holding the bare key,
    as API gateways take it (e.g. `x-api-key`)."""
    openai_strict: bool = False
    """Refuse vLLM-only fields with 400 as api.openai.com does (an OpenAI-compatible API, not vLLM)."""
    vllm_release: Literal["0.28", "0.33"] = "0.33"
    """Whose pause behaviour to follow for new requests: after `/pause?mode=abort|wait`, 0.28 queues
    them until /resume and 0.33 answers them 503 (`mode=keep` queues them in both)."""
    dtype: str = "bfloat16"
    """The dtype `/server_info` reports (vLLM serves a bf16 checkpoint in bfloat16)."""


# -- the "tokenizer" and chat template ----------------------------------------------------------


CHUNK_VOCAB = 151_000
"""Vocabulary size when `bytes_per_token` > 1 (a Qwen-sized one: ids of up to 6 digits)."""


def encode(text: str, k: int = 1) -> list[int]:
    """Text as ids: one a byte, or with k > 1 one per k bytes (an id >= VOCAB_SIZE hashed from them)."""
    if k == 1:
        return [b + BYTE_OFFSET for b in text.encode()]
    data = text.encode()
    span = CHUNK_VOCAB - VOCAB_SIZE
    return [VOCAB_SIZE + zlib.crc32(data[i : i + k]) % span for i in range(0, len(data), k)]


_SPECIAL = {0: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}


def decode_token(tid: int) -> str:
    """Any id of the vocabulary: a top-logprob alternative near its end wraps round to the special ids.
    A hashed id (`bytes_per_token` > 1) cannot be decoded alone: U+FFFD, as a tokenizer shows a piece
    of a character."""
    if tid < BYTE_OFFSET:
        return _SPECIAL[tid]
    if tid >= VOCAB_SIZE:
        return "\ufffd"
    return bytes([tid - BYTE_OFFSET]).decode("utf-8", errors="replace")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def tool_call_text(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def render_message(m: dict, k: int = 1) -> list[int]:
    """One message: its role line and its text encoded apart (with k = 1 the same ids as together), so
    that an assistant message's text has the ids its completion had."""
    text = _content_text(m.get("content"))
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        text += tool_call_text(fn.get("name", ""), fn.get("arguments") or "{}")
    return [IM_START, *encode(f"{m.get('role', '')}\n", k), *encode(text, k), IM_END]


def chat_prompt_ids(messages: list[dict], tools: list | None, k: int = 1) -> list[int]:
    """The chat template: an optional tools block, each message, then the generation prompt."""
    ids: list[int] = []
    if tools:
        ids += [IM_START, *encode("tools\n" + orjson.dumps(tools).decode(), k), IM_END]
    for m in messages:
        ids += render_message(m, k)
    return ids + [IM_START, *encode("assistant\n", k)]


def logprob_of(tid: int, position: int) -> float:
    """The imitation's deterministic 'sampled logprob' (always < 0)."""
    return -round(0.001 + ((tid * 2654435761 + position * 40503) % 10007) / 10007 * 4.0, 6)


def _tool_arguments(tool: dict) -> str:
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or list(props)
    args: dict[str, Any] = {}
    for name in required:
        prop = props.get(name)
        kind = prop.get("type") if isinstance(prop, dict) else None  # `true` is a schema too
        args[name] = 1 if kind == "integer" else True if kind == "boolean" else "echo hello"
    return orjson.dumps(args).decode()


class _Completion:
    """One sampled completion: its tokens, text, and how it maps onto chat deltas."""

    def __init__(
        self, prompt_ids: list[int], body: dict, settings: ImitationSettings, tools: list | None, index: int = 0
    ):
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        seed = zlib.crc32(bytes(str(len(prompt_ids)), "ascii") + bytes(t % 256 for t in prompt_ids[-64:]))
        seed += index * 7  # the choices of `n` > 1 differ; choice 0 is the one `n` = 1 gets
        self.index = index
        tool_choice = body.get("tool_choice", "auto")
        self.tool: dict | None = None
        if tools and tool_choice != "none":
            if isinstance(tool_choice, dict):
                name = (tool_choice.get("function") or {}).get("name")
                tool = next((t for t in tools if (t.get("function") or {}).get("name") == name), tools[0])
            else:
                callable_ = [
                    t for t in tools if (t.get("function") or {}).get("name") not in settings.excluded_tools
                ]
                callable_ = callable_ or tools
                tool = callable_[seed % len(callable_)]
            arguments = settings.tool_arguments
            if arguments is None:
                arguments = _tool_arguments(tool)
            self.tool = {"name": tool["function"]["name"], "arguments": arguments}
            self.prefix = f'<tool_call>{{"name": "{self.tool["name"]}", "arguments": '
            text = self.prefix + self.tool["arguments"] + "}</tool_call>"
        else:
            words, size, i = [], 0, seed
            while size < settings.completion_tokens:
                w = _WORDS[i % len(_WORDS)].decode() + " "
                words.append(w)
                size += len(w)
                i = i * 1103515245 + 12345
            text = "".join(words)[: max(settings.completion_tokens - 1, 0) * settings.bytes_per_token]
        self.k = k = settings.bytes_per_token
        ids = [*encode(text, k), IM_END]
        if k == 1:
            texts = [chr(t - BYTE_OFFSET) for t in ids[:-1]]
        else:
            data = text.encode()
            texts = [data[i : i + k].decode(errors="replace") for i in range(0, len(data), k)]
        self._texts = [*texts, decode_token(IM_END)]
        self.finish_reason = "tool_calls" if self.tool else "stop"
        self.stop_reason: str | int | None = None
        end, text = self._stop(ids, body, limit, text)
        if end < len(ids):
            self.tool = None  # a cut tool call is text, as vLLM's hermes parser leaves it
        self.ids = ids[:end]
        self._texts = self._texts[:end]
        self.text = text
        self.call_id = f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"

    def _stop(self, ids: list[int], body: dict, limit: int | None, text: str) -> tuple[int, str]:
        """Where the completion ends and its text, token by token as vLLM checks: the EOS or a
        `stop_token_ids` id ends it with that token kept and its text left out, the `max_tokens`-th token
        ends it (length), and a `stop` string completed by a token ends it there, the token kept and the
        text cut before the string (vllm/v1/core/sched/utils.py check_stop, vllm/v1/engine/detokenizer.py)."""
        stop_ids = set(body.get("stop_token_ids") or ())
        stops = body.get("stop") or []
        stops = [s for s in ([stops] if isinstance(stops, str) else stops) if s]
        kept = ""
        for i, tid in enumerate(ids):
            if tid == IM_END:
                return i + 1, kept
            if tid in stop_ids:
                self.finish_reason, self.stop_reason = "stop", tid
                return i + 1, kept
            kept += self._texts[i]
            for stop in stops:  # in the request's order, as check_stop_strings tries them
                at = kept.find(stop, max(len(kept) - len(self._texts[i]) - len(stop) + 1, 0))
                if at >= 0:
                    self.finish_reason, self.stop_reason = "stop", stop
                    return i + 1, kept[:at]
            if limit is not None and i + 1 >= limit:
                self.finish_reason = "length"
                return i + 1, kept
        return len(ids), text

    def token_texts(self) -> list[str]:
        """Each token's text (the EOS's special text for the last when it ends the completion)."""
        return self._texts

    def shown_texts(self) -> list[str]:
        """Each token's share of the completion's text: what its streamed delta carries (a token left out
        of the text, the EOS or a stop token, or cut by a stop string carries what is left of it)."""
        shown, at = [], 0
        for piece in self._texts:
            shown.append(self.text[at : at + len(piece)])
            at += len(shown[-1])
        return shown

    def shown(self, i: int) -> str:
        """The decoded text of completion token i (a logprob entry's `bytes`)."""
        return decode_token(self.ids[i]) if self.k == 1 else self.token_texts()[i]


# -- the server ---------------------------------------------------------------------------------


class _CutResponse(Response):
    """Sends half of the body, then drops the connection (the engine died mid-reply)."""

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send(
            {"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True}
        )
        raise ConnectionAbortedError("imitation: connection cut mid-reply (injected failure)")


def create_imitation_app(settings: ImitationSettings | None = None) -> FastAPI:
    """The imitation as an ASGI app; `app.state.settings` and `app.state.requests` are its state."""
    app = FastAPI(title="vLLM imitation", docs_url=None, redoc_url=None)
    app.state.settings = settings or ImitationSettings()
    app.state.requests = deque(maxlen=256)
    fixed_prompt: dict[int, list[int]] = {}

    def s() -> ImitationSettings:
        return app.state.settings

    def headers() -> dict[str, str]:
        pv = s().policy_version
        return {} if pv is None else {POLICY_VERSION_HEADER: str(pv)}

    def error(status: int, message: str, kind: str, param: str | None = None) -> Response:
        body = error_body(message, kind, status, param)
        return Response(
            orjson.dumps(body), status_code=status, media_type="application/json", headers=headers()
        )

    def prompt_for(body: dict, endpoint: str) -> list[int]:
        n = s().prompt_tokens
        if n is not None:
            if n not in fixed_prompt:
                fixed_prompt[n] = [BYTE_OFFSET + (i * 7919) % 256 for i in range(n)]
            return fixed_prompt[n]
        if endpoint == "chat":
            return chat_prompt_ids(body["messages"], body.get("tools"), s().bytes_per_token)
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return list(prompt)
        return encode(prompt if isinstance(prompt, str) else prompt[0], s().bytes_per_token)

    async def handle(request: Request, endpoint: str) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return error(400, f"invalid JSON: {exc}", "BadRequestError")
        app.state.requests.append(body)
        cfg = s()
        if cfg.api_key is not None:
            sent = request.headers.get(cfg.api_key_header, "")
            expected = (
                f"Bearer {cfg.api_key}" if cfg.api_key_header.lower() == "authorization" else cfg.api_key
            )
            if sent != expected:
                return error(401, "imitation: missing or wrong API key", "AuthenticationError")
        if cfg.openai_strict and (extra := sorted(VLLM_ONLY_FIELDS & body.keys())):
            return error(
                400, f"Unrecognized request argument supplied: {', '.join(extra)}", "BadRequestError"
            )
        if cfg.fail == "http_500":
            return error(500, "imitation: injected internal error", "InternalServerError")
        if cfg.fail == "http_400":
            return error(400, "imitation: this model's maximum context length is 8 tokens", "BadRequestError")
        if cfg.fail == "hang":
            await asyncio.sleep(cfg.hang_s)
        if body.get("model") != cfg.model:
            # vLLM 0.32 names the parameter and the served names (checked by tests/vllm_live).
            message = f"The model `{body.get('model')}` does not exist. Valid aliases: {cfg.model}."
            return error(404, message, "NotFoundError", "model")
        if (refused := _sampling_refusal(body, endpoint)) is not None:
            return error(400, *refused)
        if cfg.latency_s:
            await asyncio.sleep(cfg.latency_s)
        if (refused := _paused_refusal(app, cfg)) is not None:
            return error(*refused)
        await app.state.running.wait()  # paused: held, answered after /resume (vLLM's pause mode keep)
        prompt_ids = prompt_for(body, endpoint)
        tools = body.get("tools") if endpoint == "chat" else None
        comps = [_Completion(prompt_ids, body, cfg, tools, i) for i in range(int(body.get("n") or 1))]
        if body.get("stream"):
            gen = _chat_stream if endpoint == "chat" else _completion_stream
            return StreamingResponse(
                gen(body, prompt_ids, comps, cfg), media_type="text/event-stream", headers=headers()
            )
        make = _chat_response if endpoint == "chat" else _completion_response
        content = orjson.dumps(make(body, prompt_ids, comps, cfg))
        if cfg.fail == "cut":
            return _CutResponse(content, media_type="application/json", headers=headers())
        return Response(content, media_type="application/json", headers=headers())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(request, "completions")

    @app.get("/v1/models")
    async def models() -> Response:
        cfg = s()
        card = {
            "id": cfg.model, "object": "model", "created": now(), "owned_by": "vllm", "root": cfg.model,
            "parent": None, "max_model_len": 32768,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now(),
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                "group": None, "is_blocking": False,
            }],
        }  # fmt: skip
        return Response(
            orjson.dumps({"object": "list", "data": [card]}), media_type="application/json", headers=headers()
        )

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    _add_rl_routes(app)

    @app.post("/imitation/settings")
    async def update_settings(request: Request) -> Response:
        app.state.settings = ImitationSettings.model_validate(
            s().model_dump() | orjson.loads(await request.body())
        )
        return Response(app.state.settings.model_dump_json(), media_type="application/json")

    @app.get("/imitation/requests")
    async def received() -> Response:
        return Response(orjson.dumps(list(app.state.requests)), media_type="application/json")

    return app


# -- vLLM's RL routes (vllm/entrypoints/serve/dev/rlhf/api_router.py in 0.28.0, -----------------------
# -- vllm/entrypoints/rl/online/api_router.py in 0.33.0; docs/design.md 3.9 has the table) -------------


_PAUSED_503 = "Generation is paused. Please retry after it resumes."
"""vLLM 0.33's refusal of a new request while paused in abort/wait mode (`_reject_add_while_paused`,
vllm/v1/engine/core.py), a RetryableRequestError answered 503 (serve/exception_handling/error_response.py)."""


def _paused_refusal(app: FastAPI, cfg: ImitationSettings) -> tuple[int, str, str] | None:
    if app.state.running.is_set() or app.state.pause_mode == "keep" or cfg.vllm_release == "0.28":
        return None
    return 503, _PAUSED_503, "ServiceUnavailableError"


def _add_rl_routes(app: FastAPI) -> None:
    """The control routes a trainer drives, with vLLM's answers and status codes: pause/resume (a
    paused imitation holds replies until /resume, as `mode=keep` does, or refuses new ones per
    `vllm_release`; it has no running batch to abort or drain), the weight tag ("default" until
    /finish_weight_update or /update_weight_version names one, a string), and vLLM's worker's update
    bookkeeping (`Worker` in vllm/v1/worker/gpu_worker.py: start opens an update, a second start, an
    update or finish outside one are refused with 500). It moves no tensors: it is vLLM whose transfer
    group never formed, so /init_weight_transfer_engine and /update_weights answer 500 as vLLM does
    then (use the embedded engine to move tensors)."""
    app.state.weight_version = "default"
    app.state.running = asyncio.Event()
    app.state.running.set()
    app.state.pause_mode = "keep"
    app.state.update_open = False

    def answer(body: dict, status: int = 200) -> Response:
        return Response(orjson.dumps(body), status_code=status, media_type="application/json")

    def refused(message: str, status: int = 500) -> Response:
        # vLLM: an engine failure is `Call to <utility> method failed: ...`, type InternalServerError;
        # a malformed body is the HTTP status phrase ("Bad Request").
        kind = "InternalServerError" if status == 500 else "Bad Request"
        text = f"Call to collective_rpc method failed: {message}" if status == 500 else message
        return answer(error_body(text, kind, status), status)

    async def body_of(request: Request) -> dict | Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return refused("Invalid JSON format", 400)
        return body if isinstance(body, dict) else refused("Request body must be a JSON object", 400)

    async def tag_from(request: Request, key: str) -> str | None | Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        value = body.get(key)
        if value is not None and not isinstance(value, str):
            return refused(f"{key}: Input should be a valid string", 400)
        return value

    @app.get("/get_world_size")
    async def get_world_size() -> dict[str, int]:
        return {"world_size": 1}

    @app.get("/server_info")
    async def server_info(config_format: str = "text") -> Response:
        cfg = app.state.settings
        config = {"model_config": {"model": cfg.model, "served_model_name": cfg.model, "dtype": f"torch.{cfg.dtype}",
                                   "max_model_len": 32768}, "parallel_config": {"world_size": 1}}  # fmt: skip
        return answer({"vllm_config": config if config_format == "json" else str(config), "vllm_env": {},
                       "system_env": {}})  # fmt: skip

    @app.post("/pause")
    async def pause(mode: str = "abort") -> Response:
        if mode not in ("abort", "wait", "keep"):
            return refused(f"mode: Input should be 'abort', 'wait' or 'keep' (got {mode!r})", 400)
        app.state.pause_mode = mode
        app.state.running.clear()
        return answer({"status": "paused"})

    @app.post("/resume")
    async def resume() -> dict[str, str]:
        app.state.running.set()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, bool]:
        return {"is_paused": not app.state.running.is_set()}

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        info = body.get("init_info")
        if info is None:
            return refused("Missing 'init_info' in request body", 400)
        if not isinstance(info, dict) and app.state.settings.vllm_release == "0.33":
            return refused("init_info: Input should be a valid dictionary", 400)
        return refused("the vLLM imitation moves no tensors (use the embedded engine to sync weights)")

    @app.post("/start_weight_update")
    async def start_weight_update() -> Response:
        if app.state.update_open:
            return refused("start_weight_update called while a weight update is already active. "
                           "Call finish_weight_update first.")  # fmt: skip
        app.state.update_open = True
        return answer({"message": "Weight update started"})

    @app.post("/update_weights")
    async def update_weights(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        if body.get("update_info") is None:
            return refused("Missing 'update_info' in request body", 400)
        if not app.state.update_open:
            return refused("start_weight_update must be called before update_weights.")
        app.state.update_open = False  # vLLM's worker ends an update that failed
        return refused("NCCL weight transfer not initialized. Call init_transfer_engine() first.")

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request) -> Response:
        version = await tag_from(request, "weight_version")
        if isinstance(version, Response):
            return version
        if not app.state.update_open:
            return refused("finish_weight_update called without a matching start_weight_update.")
        app.state.update_open = False
        if version is not None:
            app.state.weight_version = version
        return answer({"message": "Weight update finished"})

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        version = await tag_from(request, "new_version")
        if isinstance(version, Response):
            return version
        if version is None:
            return refused("new_version: Field required", 400)
        app.state.weight_version = version
        return answer({"success": True, "new_version": version})

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str]:
        return {"weight_version": app.state.weight_version}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, bool]:
        return {"success": True}  # vllm/entrypoints/serve/dev/cache/api_router.py


# -- response shapes ----------------------------------------------------------------------------


def _wants_ids(body: dict, cfg: ImitationSettings) -> bool:
    return bool(body.get("return_token_ids")) and cfg.fail != "no_token_ids"


def _token_string(tid: int, i: int, cfg: ImitationSettings) -> str:
    if cfg.token_id_strings:
        shown = tid + 1 if (cfg.fail == "token_mismatch" and i == 0) else tid
        return token_id_string(shown)
    return decode_token(tid)


_INT_FIELDS = ("n", "max_tokens", "max_completion_tokens", "top_k", "seed", "logprobs", "top_logprobs")


def _sampling_refusal(body: dict, endpoint: str) -> tuple[str, str, str | None] | None:
    """vLLM 0.32's 400s for sampling fields, in its order (checked by tests/vllm_live): a string that is no
    integer where one is due (the request model's pydantic error, as the server's validation handler
    words it, vllm/entrypoints/serve/exception_handling/handlers/validation.py), `n` < 1, then
    SamplingParams._verify_args's temperature, top_p, max_tokens and logprobs checks (vllm/sampling_params.py;
    the server appends "(parameter=..., value=...)"): (message, type, param), or None."""
    for key in _INT_FIELDS:
        value = body.get(key)
        if isinstance(value, str) and not value.strip().lstrip("+-").isdigit():
            error = {"type": "int_parsing", "loc": f"body.{key}", "input": value,
                     "msg": "Input should be a valid integer, unable to parse string as an integer"}  # fmt: skip
            error = {k: error[k] for k in ("type", "loc", "msg", "input")}  # pydantic's order
            return f"1 validation error:\n  {error}", "Bad Request", f"body.{key}"
    if isinstance(body.get("n"), int) and body["n"] < 1:
        return f"n must be at least 1, got {body['n']}.", "BadRequestError", None

    def refused(name: str, rule: str, value: float | int) -> tuple[str, str, str]:
        return f"{name} must be {rule}, got {value}. (parameter={name}, value={value})", "BadRequestError", name

    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not 0 <= temperature <= 2:
        return refused("temperature", "non-negative" if temperature < 0 else "in [0, 2]", float(temperature))
    top_p = body.get("top_p")
    if isinstance(top_p, int | float) and not 0 < top_p <= 1:
        return refused("top_p", "in (0, 1]", float(top_p))
    max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), None)
    if isinstance(max_tokens, int) and max_tokens < 1:
        return refused("max_tokens", "at least 1", max_tokens)
    asked = body.get("top_logprobs") if endpoint == "chat" else body.get("logprobs")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > MAX_TOP_LOGPROBS:
        message = (
            f"Requested sample logprobs of {asked}, which is greater than max allowed: {MAX_TOP_LOGPROBS} "
            f"(parameter=logprobs, value={asked})"
        )
        return message, "BadRequestError", "logprobs"
    return None


def _alternative_gap(body: dict, cfg: ImitationSettings) -> float:
    """How far apart the top-logprob alternatives are: 1 / temperature, as processed logprobs spread
    apart at a lower temperature (vLLM's floor of 0.01 applies, and greedy (0) reports the unscaled
    logits'); 1 for raw logprobs."""
    if cfg.logprobs_mode == "raw_logprobs":
        return 1.0
    temperature = effective_temperature(
        float(body.get("temperature") or 0.0) if "temperature" in body else 1.0
    )
    return 1.0 if temperature < 1e-5 else 1.0 / temperature


def _chat_logprob(
    tid: int, i: int, cfg: ImitationSettings, top: int, decoded: str | None = None, gap: float = 1.0
) -> dict:
    """One token's logprob entry as vLLM builds it (`_create_chat_logprobs` and `_get_top_logprobs` in
    vllm/entrypoints/openai/chat_completion/serving.py): the entry's `bytes` are the decoded token's,
    each top-logprob alternative's the bytes of the token string it shows (`token_id:N` too); the k-th
    alternative lies `k * gap` below the sampled token."""
    tok = _token_string(tid, i, cfg)
    lp = logprob_of(tid, i)
    decoded = decode_token(tid) if decoded is None else decoded
    entries = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}] if top else []
    for k in range(1, top):
        alt = (tid + k) % VOCAB_SIZE
        alt_tok = token_id_string(alt) if cfg.token_id_strings else decode_token(alt)
        entries.append({"token": alt_tok, "logprob": lp - k * gap, "bytes": list(alt_tok.encode())})
    return {"token": tok, "logprob": lp, "bytes": list(decoded.encode()), "top_logprobs": entries}


def _wants_logprobs(body: dict, cfg: ImitationSettings) -> bool:
    return bool(body.get("logprobs")) and cfg.fail != "no_logprobs"


def _usage(prompt_ids: list[int], comps: list[_Completion]) -> dict:
    return usage(len(prompt_ids), sum(len(comp.ids) for comp in comps))


def _chat_response(
    body: dict, prompt_ids: list[int], comps: list[_Completion], cfg: ImitationSettings
) -> dict:
    return {
        "id": new_id("chatcmpl"), "object": "chat.completion", "created": now(),
        "model": cfg.model, "choices": [_chat_choice(body, comp, cfg) for comp in comps], "service_tier": None,
        "system_fingerprint": None, "usage": _usage(prompt_ids, comps), "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if _wants_ids(body, cfg) else None, "prompt_text": None,
        "kv_transfer_params": None,
    }  # fmt: skip


def _chat_choice(body: dict, comp: _Completion, cfg: ImitationSettings) -> dict:
    wants_ids = _wants_ids(body, cfg)
    message: dict[str, Any] = {
        "role": "assistant", "content": None if comp.tool else comp.text, "refusal": None, "annotations": None,
        "audio": None, "function_call": None, "reasoning": None,
    }  # fmt: skip
    if comp.tool:
        message["tool_calls"] = [
            {
                "id": comp.call_id,
                "type": "function",
                "function": {"name": comp.tool["name"], "arguments": comp.tool["arguments"]},
            }
        ]
    logprobs = None
    if _wants_logprobs(body, cfg):
        top = body.get("top_logprobs") or 0
        gap = _alternative_gap(body, cfg)
        logprobs = {
            "content": [_chat_logprob(t, i, cfg, top, comp.shown(i), gap) for i, t in enumerate(comp.ids)]
        }
    return {
        "index": comp.index, "message": message, "logprobs": logprobs, "finish_reason": comp.finish_reason,
        "stop_reason": comp.stop_reason, "token_ids": comp.ids if wants_ids else None, "routed_experts": None,
    }  # fmt: skip


def _completion_logprobs(
    comp: _Completion, cfg: ImitationSettings, start: int, end: int, top: int, gap: float
) -> dict:
    """vLLM's CompletionLogProbs for tokens start..end (`_create_completion_logprobs`,
    vllm/entrypoints/openai/completion/serving.py): each offset advances by the length of the token string
    shown before it (`token_id:N` too, and across a stream's chunks), and each position's top_logprobs
    holds the sampled token first, then the `logprobs` best alternatives."""
    tokens = [_token_string(comp.ids[i], i, cfg) for i in range(start, end)]
    offset = sum(len(_token_string(comp.ids[i], i, cfg)) for i in range(start))
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    tops = []
    for i in range(start, end):
        entry = _chat_logprob(comp.ids[i], i, cfg, top + 1, gap=gap)
        tops.append({alt["token"]: alt["logprob"] for alt in entry["top_logprobs"]})
    return {
        "text_offset": offsets,
        "token_logprobs": [logprob_of(comp.ids[i], i) for i in range(start, end)],
        "tokens": tokens,
        "top_logprobs": tops,
    }


def _completion_finish(comp: _Completion) -> str:
    return "stop" if comp.finish_reason == "tool_calls" else comp.finish_reason  # no tool parser here


def _completion_response(
    body: dict, prompt_ids: list[int], comps: list[_Completion], cfg: ImitationSettings
) -> dict:
    wants_ids = _wants_ids(body, cfg)
    choices = []
    for comp in comps:
        logprobs = None
        if body.get("logprobs") is not None and cfg.fail != "no_logprobs":
            gap = _alternative_gap(body, cfg)
            logprobs = _completion_logprobs(comp, cfg, 0, len(comp.ids), body["logprobs"], gap)
        choices.append({
            "index": comp.index, "text": comp.text, "logprobs": logprobs, "finish_reason": _completion_finish(comp),
            "stop_reason": comp.stop_reason, "token_ids": comp.ids if wants_ids else None, "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if wants_ids else None,
        })  # fmt: skip
    return {
        "id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": cfg.model,
        "choices": choices, "service_tier": None, "system_fingerprint": None, "usage": _usage(prompt_ids, comps),
        "kv_transfer_params": None,
    }  # fmt: skip


def _event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chat_deltas(comp: _Completion) -> Iterator[dict]:
    """The delta of each completion token, as vLLM's hermes tool parser streams them."""
    texts = comp.token_texts()
    if not comp.tool:
        for shown in comp.shown_texts():
            yield {"content": shown}
        return
    n_prefix = len(comp.prefix.encode())
    n_args = len(comp.tool["arguments"].encode())
    if comp.k > 1:
        yield from _chunked_tool_deltas(comp, n_prefix, n_args)
        return
    for i, t in enumerate(texts):
        if i == n_prefix - 1:
            yield {
                "tool_calls": [
                    {
                        "id": comp.call_id,
                        "type": "function",
                        "index": 0,
                        "function": {"name": comp.tool["name"]},
                    }
                ]
            }
        elif n_prefix <= i < n_prefix + n_args:
            yield {"tool_calls": [{"index": 0, "function": {"arguments": t}}]}
        else:
            yield {}


def _chunked_tool_deltas(comp: _Completion, n_prefix: int, n_args: int) -> Iterator[dict]:
    """The tool-call deltas when a token is k bytes: the call's header with the token that ends its
    prefix, and each token's share of the arguments' bytes."""
    data, k = comp.text.encode(), comp.k
    args = data[n_prefix : n_prefix + n_args]
    for i in range(len(comp.ids)):
        start, end = i * k, min((i + 1) * k, len(data))
        piece = args[max(start - n_prefix, 0) : max(end - n_prefix, 0)].decode(errors="replace")
        function: dict[str, str] = {"arguments": piece} if piece else {}
        if start <= n_prefix - 1 < end:
            call = {"id": comp.call_id, "type": "function", "index": 0}
            yield {"tool_calls": [{**call, "function": {"name": comp.tool["name"], **function}}]}  # type: ignore[index]
        elif piece:
            yield {"tool_calls": [{"index": 0, "function": function}]}
        else:
            yield {}


async def _maybe_fail(cfg: ImitationSettings, sent: int) -> bytes | None:
    if cfg.fail == "cut" and sent >= cfg.fail_after_chunks:
        raise ConnectionAbortedError("imitation: stream cut (injected failure)")
    if cfg.fail == "stream_error" and sent >= cfg.fail_after_chunks:
        err = error_body("imitation: engine error mid-stream", "InternalServerError", 500)
        return _event(err) + b"data: [DONE]\n\n"
    return None


async def _chat_stream(
    body: dict, prompt_ids: list[int], comps: list[_Completion], cfg: ImitationSettings
) -> AsyncIterator[bytes]:
    """vLLM's chat stream: each choice's role chunk (the first carries the prompt ids), then each
    choice's tokens in turn (the order vLLM 0.32 sends `n` > 1 in), the usage chunk if asked, [DONE]."""
    rid, created = new_id("chatcmpl"), now()
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": cfg.model}
    wants_ids = _wants_ids(body, cfg)
    wants_lp = _wants_logprobs(body, cfg)
    top = body.get("top_logprobs") or 0
    gap = _alternative_gap(body, cfg)
    if cfg.fail == "cut" and cfg.fail_after_chunks == 0:
        raise ConnectionAbortedError("imitation: stream cut before the first event (injected failure)")
    # vLLM sets these fields explicitly and dumps chunks with `exclude_unset=True`, so its chunks keep
    # them when they are None: the first one's `prompt_token_ids` and `prompt_text`, every later one's
    # `token_ids` (vllm/entrypoints/openai/chat_completion/serving.py, chat_completion_stream_generator).
    for comp in comps:
        first = {"index": comp.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}  # fmt: skip
        yield _event(
            {**head, "choices": [first], "prompt_token_ids": prompt_ids if wants_ids else None, "prompt_text": None}
        )
    sent = 1
    for comp in comps:
        for i, (tid, delta) in enumerate(zip(comp.ids, _chat_deltas(comp), strict=True)):
            if (end := await _maybe_fail(cfg, sent)) is not None:
                yield end
                return
            if cfg.token_latency_s:
                await asyncio.sleep(cfg.token_latency_s)
            last = i == len(comp.ids) - 1
            choice: dict[str, Any] = {
                "index": comp.index, "delta": delta,
                "logprobs": {"content": [_chat_logprob(tid, i, cfg, top, comp.shown(i), gap)]} if wants_lp else None,
                "finish_reason": comp.finish_reason if last else None,
            }  # fmt: skip
            if last:
                choice["stop_reason"] = comp.stop_reason
            choice["token_ids"] = [tid] if wants_ids else None
            yield _event({**head, "choices": [choice]})
            sent += 1
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _event(
            {
                **head,
                "choices": [],
                "usage": {k: v for k, v in _usage(prompt_ids, comps).items() if v is not None},
            }
        )
    yield b"data: [DONE]\n\n"


async def _completion_stream(
    body: dict, prompt_ids: list[int], comps: list[_Completion], cfg: ImitationSettings
) -> AsyncIterator[bytes]:
    """vLLM's completion stream: each choice's tokens in turn, one a chunk; with `return_token_ids` every
    chunk has `prompt_token_ids`, the ids in a choice's first and null after (completion/serving.py)."""
    rid, created = new_id("cmpl"), now()
    head = {"id": rid, "object": "text_completion", "created": created, "model": cfg.model}
    wants_ids = _wants_ids(body, cfg)
    wants_lp = body.get("logprobs") is not None and cfg.fail != "no_logprobs"
    gap = _alternative_gap(body, cfg)
    sent = 0
    for comp in comps:
        for i, (tid, text) in enumerate(zip(comp.ids, comp.shown_texts(), strict=True)):
            if (end := await _maybe_fail(cfg, sent)) is not None:
                yield end
                return
            if cfg.token_latency_s:
                await asyncio.sleep(cfg.token_latency_s)
            last = i == len(comp.ids) - 1
            choice: dict[str, Any] = {
                "index": comp.index, "text": text,
                "logprobs": _completion_logprobs(comp, cfg, i, i + 1, body.get("logprobs"), gap) if wants_lp else None,
                "finish_reason": _completion_finish(comp) if last else None,
                "stop_reason": comp.stop_reason if last else None,
            }  # fmt: skip
            if wants_ids:
                choice["prompt_token_ids"] = prompt_ids if i == 0 else None
                choice["token_ids"] = [tid]
            yield _event({**head, "choices": [choice]})
            sent += 1
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _event(
            {
                **head,
                "choices": [],
                "usage": {k: v for k, v in _usage(prompt_ids, comps).items() if v is not None},
            }
        )
    yield b"data: [DONE]\n\n"


# -- running it ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve the vLLM imitation (tests and benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="imitation-model")
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--completion-tokens", type=int, default=16)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--bytes-per-token", type=int, default=1)
    parser.add_argument("--tool-arguments", default=None, help="every tool call's arguments, verbatim")
    args = parser.parse_args()
    import uvicorn

    settings = ImitationSettings(
        model=args.model, prompt_tokens=args.prompt_tokens, completion_tokens=args.completion_tokens,
        latency_s=args.latency_s, bytes_per_token=args.bytes_per_token, tool_arguments=args.tool_arguments,
    )  # fmt: skip
    uvicorn.run(
        create_imitation_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
