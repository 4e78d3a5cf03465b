"""Typed `task.toml` (Harbor's schema 1.x).

Field names are Harbor's. Legacy spellings are read and mapped onto the current ones before
validation: top-level `version` -> `schema_version`, `[environment] memory = "4G"` -> `memory_mb`,
`storage = "10G"` -> `storage_mb`, `allow_internet = true|false` -> `network_mode`. Keys this model
does not know are kept (`model_extra`), never fatal; `unknown_keys()` lists them so `harbor tasks
check` can say so. Values are validated strictly (a string where a number belongs is an error, an
integer where a float belongs is fine).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NetworkMode = Literal["public", "no-network", "allowlist"]

SUPPORTED_SCHEMA_MAJOR = 1

_SECTION_CONFIG = ConfigDict(extra="allow", strict=True)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_TO_MB = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_size_mb(value: str | int | float) -> int:
    """Harbor's legacy sizes ("512M", "4G", "10GB") in MiB; a bare number is bytes (Docker's rule)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as '4G', got a boolean")
    if isinstance(value, int | float):
        return max(1, int(value / (1024 * 1024)))
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"cannot read size {value!r}; use a number with K, M, G or T (e.g. '4G')")
    number, unit = match.groups()
    return max(1, int(float(number) * _SIZE_TO_MB[unit.upper()]))


class TaskSection(BaseModel):
    """`[task]`: who the task is."""

    model_config = _SECTION_CONFIG

    name: str | None = Field(default=None, min_length=1)
    """Human-readable name; defaults to the task folder's name."""
    description: str | None = None


class VerifierConfig(BaseModel):
    """`[verifier]`: how the task's tests are run after the agent stops."""

    model_config = _SECTION_CONFIG

    timeout_sec: float = Field(default=600.0, gt=0)
    """Seconds `tests/test.sh` may run before it is killed and the reward is None."""
    reward_key: str | None = None
    """Which key of `reward.json` is the reward (a single key is used as is, else `reward`)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for `test.sh`."""


class AgentConfig(BaseModel):
    """`[agent]`: limits for the agent's turn."""

    model_config = _SECTION_CONFIG

    timeout_sec: float = Field(default=600.0, gt=0)
    """Seconds the agent (or the oracle) may run before it is stopped."""


class SolutionConfig(BaseModel):
    """`[solution]`: how the oracle `solution/solve.sh` is run."""

    model_config = _SECTION_CONFIG

    env: dict[str, str] = Field(default_factory=dict)


class EnvironmentConfig(BaseModel):
    """`[environment]`: the sandbox the agent works in."""

    model_config = _SECTION_CONFIG

    build_timeout_sec: float = Field(default=600.0, gt=0)
    """Seconds building the image from `environment/Dockerfile` may take."""
    docker_image: str | None = Field(default=None, min_length=1)
    """A prebuilt image to use instead of building `environment/`."""
    cpus: float = Field(default=1.0, gt=0)
    memory_mb: int = Field(default=2048, gt=0)
    storage_mb: int = Field(default=10240, gt=0)
    pids_limit: int = Field(default=512, gt=0)
    """Most processes the sandbox may run at once (a Harbor-RL extension; contains fork bombs)."""
    network_mode: NetworkMode = "no-network"
    """public: anything; no-network: only the capture proxy; allowlist: the proxy plus `allowed_hosts`."""
    allowed_hosts: list[str] = Field(default_factory=list)
    workdir: str = "/app"
    """Absolute path the agent starts in (the Dockerfile's WORKDIR)."""
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _map_legacy(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, current in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy in data and current not in data:
                data[current] = parse_size_mb(data.pop(legacy))
        if "allow_internet" in data and "network_mode" not in data:
            allow = data.pop("allow_internet")
            if not isinstance(allow, bool):
                raise ValueError(f"allow_internet must be true or false, got {allow!r}")
            data["network_mode"] = "public" if allow else "no-network"
        return data

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _allowlist_has_hosts(self) -> EnvironmentConfig:
        if self.network_mode == "allowlist" and not self.allowed_hosts:
            raise ValueError("network_mode = 'allowlist' needs at least one entry in allowed_hosts")
        return self


class TaskConfig(BaseModel):
    """One `task.toml`."""

    model_config = _SECTION_CONFIG

    schema_version: str = "1.0"
    task: TaskSection = Field(default_factory=TaskSection)
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)

    @model_validator(mode="before")
    @classmethod
    def _map_legacy(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data and "schema_version" not in data:
            data = dict(data)
            data["schema_version"] = data.pop("version")
        return data

    @field_validator("schema_version")
    @classmethod
    def _supported_schema(cls, value: str) -> str:
        major = value.split(".", 1)[0]
        if major != str(SUPPORTED_SCHEMA_MAJOR):
            raise ValueError(f"schema version {value!r} is not supported; this reader knows 1.x")
        return value

    def unknown_keys(self) -> list[str]:
        """Dotted paths of every key this model kept without knowing it."""
        found = [key for key in (self.model_extra or {})]
        for section in ("task", "verifier", "agent", "environment", "solution"):
            extra = getattr(self, section).model_extra or {}
            found.extend(f"{section}.{key}" for key in extra)
        return sorted(found)
