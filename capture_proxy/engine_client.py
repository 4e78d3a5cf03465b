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
from capture_proxy.transport import FastHTTPTransport

log = logging.getLogger(__name__)

_SAMPLING_ROUTES = {"chat": "/chat/completions", "completions": "/completions"}


class EngineClient:
    """POSTs agent calls to their session's engine; the reply's body is left for the caller to read."""

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

    async def send(self, call: ModelCall) -> httpx.Response:
        """POST the rewritten request to the engine; the response body is not read yet.

        An eval session may point at an OpenAI-compatible API that is not vLLM and refuses
        `return_token_ids`: the call is sent again without it (the turn is then kept without token
        ids, a warning for eval), and later eval calls to that upstream leave it out from the start.
        """
        base = call.live.base
        if call.live.purpose == "eval" and base in self._plain_upstreams:
            call.upstream.pop("return_token_ids", None)
        resp = await self._post(call)
        if resp.status_code == 400 and call.live.purpose == "eval" and "return_token_ids" in call.upstream:
            body = await resp.aread()
            await resp.aclose()
            if b"return_token_ids" not in body:
                return httpx.Response(400, content=body, headers=resp.headers)
            log.warning("upstream %s refuses return_token_ids; eval calls to it go without", base)
            self._plain_upstreams.add(base)
            call.upstream.pop("return_token_ids")
            resp = await self._post(call)
        return resp

    async def _post(self, call: ModelCall) -> httpx.Response:
        content = orjson.dumps(call.upstream)
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
