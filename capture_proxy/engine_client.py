"""The HTTP client to the engines: sends each call's rewritten request over the pooled transport, and
lists an engine's models."""

from __future__ import annotations

import logging

import httpx
import orjson
from starlette.responses import Response

from capture_proxy.calls import ModelCall
from capture_proxy.config import ProxyConfig
from capture_proxy.errors import upstream_error
from capture_proxy.responses import JSON
from capture_proxy.sessions import LiveSession
from capture_proxy.transport import FastHTTPTransport, Reply, request_head

log = logging.getLogger(__name__)

_SAMPLING_ROUTES = {"chat": "/chat/completions", "completions": "/completions"}


class EngineClient:
    """POSTs agent calls to their session's engine: a non-streamed call's whole reply (`call`), or a
    streamed call's response with its body left for the caller to read (`send`)."""

    def __init__(self, config: ProxyConfig, client: httpx.AsyncClient | None = None):
        # The engine calls skip the client's cookie, auth and redirect handling (an engine needs
        # none of them) and go straight to its pooled transport; `client` replaces both.
        self.transport: FastHTTPTransport | None = None
        if client is None:
            self.transport = FastHTTPTransport(max_idle_per_host=config.max_upstream_connections)
            timeout = httpx.Timeout(
                config.read_timeout_s, connect=config.connect_timeout_s, pool=config.read_timeout_s
            )
            client = httpx.AsyncClient(timeout=timeout, transport=self.transport)
        self._client = client
        # Our own transport takes requests built directly: the client's URL, header and cookie
        # merging cost more than the rest of the forwarding.
        self._extensions = {"timeout": client.timeout.as_dict()}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._targets: dict[tuple[str, str], tuple[tuple[str, int], str]] = {}
        """(engine base URL, endpoint) -> ((host, port), path) for the non-streamed path."""
        self._connect_timeout = client.timeout.connect
        self._read_timeout = client.timeout.read
        self._plain_upstreams: set[str] = set()
        """Upstream base URLs that refused vLLM's `return_token_ids` (not vLLM): eval calls omit it."""

    async def aclose(self) -> None:
        await self._client.aclose()

    async def list_models(self, live: LiveSession) -> Response:
        """The engine's `/models` reply, its 5xx turned into 502; ProxyRequestError when unreachable."""
        try:
            resp = await self._client.get(live.base + "/models", headers=live.headers)
        except httpx.TimeoutException as exc:
            raise upstream_error(
                504, f"engine timed out listing models: {exc!r}", "upstream_timeout"
            ) from exc
        except httpx.HTTPError as exc:
            raise upstream_error(
                502, f"engine unreachable at {live.base}: {exc!r}", "upstream_error"
            ) from exc
        return Response(
            resp.content,
            status_code=502 if resp.status_code >= 500 else resp.status_code,
            media_type=JSON,
        )

    async def call(self, call: ModelCall) -> Reply:
        """POST a non-streamed call and read the engine's whole reply (the eval fallback of `send`)."""
        return await self._with_fallback(call, self._whole)

    async def send(self, call: ModelCall) -> httpx.Response:
        """POST a streamed call; the response body is not read yet."""
        return await self._with_fallback(call, self._streamed)

    async def _with_fallback(self, call: ModelCall, post):
        """`post(call)`, again without `return_token_ids` when an eval session's upstream refuses it.

        An eval session may point at an OpenAI-compatible API that is not vLLM and refuses
        `return_token_ids`: the call is sent again without it (the turn is then kept without token
        ids, a warning for eval), and later eval calls to that upstream leave it out from the start.
        """
        base = call.live.base
        if call.live.purpose == "eval" and base in self._plain_upstreams:
            _without_token_ids(call)
        resp = await post(call)
        if resp.status_code != 400 or call.live.purpose != "eval" or "return_token_ids" not in call.upstream:
            return resp
        if isinstance(resp, Reply):
            content = resp.content
        else:
            content = await resp.aread()
            await resp.aclose()
        if b"return_token_ids" not in content:
            return (
                resp
                if isinstance(resp, Reply)
                else httpx.Response(400, content=content, headers=resp.headers)
            )
        log.warning("upstream %s refuses return_token_ids; eval calls to it go without", base)
        self._plain_upstreams.add(base)
        _without_token_ids(call)
        return await post(call)

    async def _whole(self, call: ModelCall) -> Reply:
        target = self._targets.get((call.live.base, call.endpoint))
        if self.transport is None or (target is None and not call.live.base.startswith("http://")):
            resp = await self._streamed(call)
            try:
                content = await resp.aread()
            finally:
                await resp.aclose()
            return Reply(resp.status_code, resp.headers, content)
        if target is None:
            url = httpx.URL(call.live.base + _SAMPLING_ROUTES[call.endpoint])
            target = self._targets[(call.live.base, call.endpoint)] = (
                (url.host, url.port or 80),
                url.raw_path.decode(),
            )
        key, path = target
        head = request_head("POST", key[0], key[1], path, call.live.headers)
        reply = await self.transport.post(
            key,
            head,
            call.content,
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
        )
        if "content-encoding" in reply.headers:  # compressed (not by vLLM): httpx decodes it
            decoded = httpx.Response(
                reply.status_code, headers=reply.headers, stream=httpx.ByteStream(reply.content)
            )
            reply.content = await decoded.aread()
        return reply

    async def _streamed(self, call: ModelCall) -> httpx.Response:
        content = call.content
        if self.transport is not None:
            key = (call.live.base, call.endpoint)
            url = self._urls.get(key)
            if url is None:
                url = self._urls[key] = httpx.URL(call.live.base + _SAMPLING_ROUTES[call.endpoint])
            request = httpx.Request(
                "POST", url, content=content, headers=call.live.headers, extensions=self._extensions
            )
            return await self.transport.handle_async_request(request)
        url = call.live.base + _SAMPLING_ROUTES[call.endpoint]
        request = self._client.build_request("POST", url, content=content, headers=call.live.headers)
        return await self._client.send(request, stream=True)


def _without_token_ids(call: ModelCall) -> None:
    """The call as sent to an upstream that refuses vLLM's `return_token_ids`."""
    if call.upstream.pop("return_token_ids", None) is not None:
        call.content = orjson.dumps(call.upstream)
