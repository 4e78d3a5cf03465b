"""Configuration of the capture proxy, validated once at the boundary."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

StreamMode = Literal["relay", "replay"]
"""How the proxy answers an agent that asks for a stream (`ProxyConfig.stream_mode`)."""

POLICY_VERSION_HEADER = "x-policy-version"
"""Response header in which the engine reports the weight version it sampled with (an integer)."""


def normalize_engine_url(url: str) -> str:
    """An engine's OpenAI base URL, ending in `/v1`, whether or not the caller wrote the `/v1`."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"engine URL {url!r} must start with http:// or https://")
    return url if url.endswith("/v1") else url + "/v1"


class ProxyConfig(BaseModel):
    """Settings of one capture proxy process (or of the capture service inside `harbor serve`)."""

    model_config = ConfigDict(extra="forbid")

    upstream_url: str | None = None
    """Default engine base URL for sessions that give no `llm_url` (with or without /v1)."""
    upstream_api_key: str | None = None
    """Key sent upstream for sessions that give none."""
    admin_key: str = Field(min_length=8)
    """Bearer key of the admin routes (`/sessions`). Never handed to an agent."""
    public_base_url: str | None = None
    """Base URL agents reach this proxy at (e.g. from inside a container); None: the URL of the admin request."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    """Largest request body accepted from an agent, in bytes; larger bodies get 413."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds to wait for a connection to the engine before answering 502."""
    read_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds to wait for the engine's next bytes (first token or next chunk) before answering 504."""
    max_upstream_connections: int = Field(default=1024, gt=0)
    """Size of the pooled connection set to the engines."""
    policy_version_header: str = POLICY_VERSION_HEADER
    """Engine response header carrying the policy (weight) version."""
    stream_mode: StreamMode = "relay"
    """An agent's streamed call. relay: the engine streams and each event goes on to the agent as it
    comes, so the agent sees tokens as they are sampled. replay: the engine is asked without streaming
    and its whole reply goes to the agent as one short event stream once the turn is stored, as
    OpenEnv's capture proxy does; it costs the proxy (and vLLM's API server) less CPU per call, and the
    agent gets no token before the last one is sampled."""

    @field_validator("upstream_url")
    @classmethod
    def _normalize(cls, v: str | None) -> str | None:
        return None if v is None else normalize_engine_url(v)

    @field_validator("public_base_url")
    @classmethod
    def _normalize_public(cls, v: str | None) -> str | None:
        return None if v is None else normalize_engine_url(v)
