"""Replies the proxy writes itself rather than relays from the engine: JSON bodies and OpenAI-style errors."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from capture_proxy.errors import ProxyRequestError

JSON = "application/json"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def error_response(exc: ProxyRequestError) -> Response:
    return json_response(exc.body(), exc.status)
