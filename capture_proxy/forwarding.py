"""Non-streamed agent calls: the engine's whole reply read and captured, its turn recorded, and the
reply passed back with only the engine-only fields the agent asked for. Streamed calls come here too
under `stream_mode = "replay"`, and get that reply as an event stream (`replay`).

The reply is parsed once (orjson) and only its capture fields are looked at; when the agent asked for
everything the engine sent (ids and logprobs), its bytes go back as they came, not re-serialised."""

from __future__ import annotations

import httpx
import orjson
from starlette.responses import Response

from capture_proxy.calls import ModelCall
from capture_proxy.engine_client import EngineClient
from capture_proxy.recording import TurnRecorder
from capture_proxy.replay import replayed
from capture_proxy.responses import JSON
from capture_proxy.upstream import capture_chat, capture_completion, strip_for_agent


class Forwarder:
    """Answers a non-streamed call once the engine's reply is in and its turn is stored."""

    def __init__(self, engine: EngineClient, recorder: TurnRecorder):
        self._engine = engine
        self._recorder = recorder

    async def forward(self, call: ModelCall) -> Response:
        try:
            resp = await self._engine.call(call)
        except httpx.HTTPError as exc:
            raise await self._recorder.transport_failure(call, exc, None) from exc
        policy_version = self._recorder.policy_version(resp.headers)
        if resp.status_code >= 400:
            raise await self._recorder.engine_refusal(call, resp.status_code, resp.content, policy_version)
        try:
            data = orjson.loads(resp.content)
            capture = capture_chat(data) if call.endpoint == "chat" else capture_completion(data)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise await self._recorder.transport_failure(
                call, ValueError(f"engine sent an unreadable reply: {exc!r}"), policy_version
            ) from exc
        changed = strip_for_agent(data, call.wants)
        await self._recorder.record(call, data, capture, policy_version)
        if call.streamed:  # only under stream_mode "replay": the engine was asked without streaming
            return replayed(call, data)
        return Response(orjson.dumps(data) if changed else resp.content, media_type=JSON)
