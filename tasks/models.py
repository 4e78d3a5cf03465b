"""Typed `task.toml`: Harbor's task schema, field for field, with Harbor's defaults and rules.

Mirrors `harbor/models/task/config.py` of the `harbor` package 0.26.0 (Harbor's schema 1.4): the same
sections, field names, defaults, legacy spellings (`version`, `[environment] memory = "4G"`,
`storage`, `allow_internet`), the same validation of allow-lists, step names, artifacts and MCP
servers, and the same lax coercion (`timeout_sec = "600"` is 600.0, as in Harbor). The resolved model
dumps (`model_dump(mode="json")`) as Harbor's does for every field Harbor has; tests/tasks/
test_harbor_differential.py checks that against Harbor's own parser on real public tasks.

Two deliberate differences, both additions: `[verifier] reward_key` (which key of a multi-metric
reward.json trains) and `[environment] pids_limit` (contains fork bombs) are ours. Keys neither
Harbor nor we know are kept (`model_extra`), never fatal; `unknown_keys()` lists them for `harbor tasks
check` (Harbor drops them silently). A schema version whose major is not 1 is refused (Harbor reads
any string); a later major may change what fields mean.

Defaults that Harbor leaves to the backend (`cpus`, `memory_mb`, `storage_mb`, `[agent] timeout_sec`,
`workdir` = None) stay None here; `tasks.loader.Task` resolves them for a run and says how.
"""

from __future__ import annotations

import math
import re
import unicodedata
from ipaddress import ip_address, ip_network
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NetworkMode = Literal["public", "no-network", "allowlist"]
TaskOS = Literal["linux", "windows"]
MCPTransport = Literal["stdio", "sse", "streamable-http"]

SUPPORTED_SCHEMA_MAJOR = 1
HARBOR_SCHEMA_VERSION = "1.4"
"""The version Harbor 0.26 writes when a task.toml gives none."""
MAIN_SERVICE = "main"
"""The compose service that is the agent's sandbox (Harbor's MAIN_SERVICE_NAME)."""
ARTIFACTS_CONVENTION_DIR = "/logs/artifacts"
"""What an agent publishes here is collected with no `artifacts` entry (Harbor's convention dir)."""

_SECTION_CONFIG = ConfigDict(extra="allow")
_ORG_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
_HOST_LABEL_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_SERVICE_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_STEP_CHARS = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_WINDOWS_DEVICE = re.compile(r"^(CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|(?:COM|LPT)[1-9¹²³])$", re.IGNORECASE)
_TOPOLOGY_RE = re.compile(r"^[1-9]\d*(x[1-9]\d*)+$")
_NOT_A_HOST = (
    "allowed_hosts entries must be hostnames, IP addresses, or IP CIDR ranges, not URLs, ports, or paths"
)


def parse_size_mb(value: str) -> int:
    """Harbor's legacy sizes: "4G" -> 4096, "512M" -> 512, "1024K" -> 1 (MiB; K, M and G only)."""
    text = value.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:]) if text else None
    if scale is None:
        raise ValueError(f"cannot read size {value!r}; write a number with K, M or G, such as '4G' or '512M'")
    try:
        return int(float(text[:-1]) * scale)
    except ValueError:
        raise ValueError(f"cannot read size {value!r}; write a number with K, M or G, such as '4G'") from None


def normalize_allowed_hosts(hosts: list[str]) -> list[str]:
    """Harbor's allow-list entries, normalised: lower-case hostnames, `*.suffix` wildcards, IPs, CIDRs."""
    return [_normalize_host(host) for host in hosts]


def _normalize_host(entry: str) -> str:
    host = entry.strip().lower().rstrip(".")
    if not host:
        raise ValueError("allowed_hosts entries must be non-empty hostnames")
    if "/" in host or ":" in host:
        try:
            if "/" in host:
                return ip_network(host, strict=True).compressed
            address = ip_address(host) if "%" not in host else None
        except ValueError:
            raise ValueError(f"{_NOT_A_HOST} (got {entry!r})") from None
        if address is None or address.version != 6:
            raise ValueError(f"{_NOT_A_HOST} (got {entry!r})")
        return address.compressed
    if "[" in host or "]" in host:
        raise ValueError(f"{_NOT_A_HOST} (got {entry!r})")
    name = host
    if host.startswith("*."):
        name = host[2:]
        if not name:
            raise ValueError("allowed_hosts wildcard entries must include a hostname suffix")
        if _is_ip(name):
            raise ValueError("allowed_hosts wildcard entries must target hostnames, not IP address literals")
    elif "*" in host:
        raise ValueError("allowed_hosts wildcard entries must use a leading '*.' prefix")
    if not all(_HOST_LABEL_RE.match(label) for label in name.split(".")):
        raise ValueError(
            f"allowed_hosts entry {entry!r} is not an IP address, a CIDR range or a hostname "
            "(letters, digits, hyphens and dots, optionally after a leading '*.')"
        )
    return host


def _is_ip(text: str) -> bool:
    try:
        ip_address(text)
    except ValueError:
        return False
    return True


def _service_name(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not _SERVICE_NAME_RE.match(value):
        raise ValueError(
            f"invalid Docker Compose service name {value!r}: start with a letter or digit; "
            "letters, digits, '-', '_' and '.' only"
        )
    return value


class NetworkPolicy(BaseModel):
    """What one phase of a run may reach (Harbor's resolved policy)."""

    model_config = ConfigDict(frozen=True)

    network_mode: NetworkMode = "public"
    allowed_hosts: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _hosts_need_allowlist(self) -> NetworkPolicy:
        # An allow-list without hosts is valid, as in Harbor: nothing but the model endpoint.
        if self.network_mode != "allowlist" and self.allowed_hosts:
            raise ValueError("allowed_hosts is only valid when network_mode='allowlist'")
        return self


def _check_policy_fields(mode: NetworkMode | None, hosts: list[str] | None) -> None:
    if mode is None:
        if hosts is not None:
            raise ValueError("allowed_hosts is only valid when network_mode='allowlist'")
        return
    if mode != "allowlist" and hosts:
        raise ValueError("allowed_hosts is only valid when network_mode='allowlist'")


class _PhaseNetwork(BaseModel):
    """`network_mode` / `allowed_hosts` of `[agent]` and `[verifier]`: None = the environment's."""

    model_config = _SECTION_CONFIG

    network_mode: NetworkMode | None = None
    """An explicit policy for this phase; None inherits the environment's."""
    allowed_hosts: list[str] | None = None
    """Hosts this phase may reach when network_mode = 'allowlist'."""

    @field_validator("allowed_hosts")
    @classmethod
    def _normalize(cls, hosts: list[str] | None) -> list[str] | None:
        return None if hosts is None else normalize_allowed_hosts(hosts)

    @model_validator(mode="after")
    def _consistent(self) -> _PhaseNetwork:
        _check_policy_fields(self.network_mode, self.allowed_hosts)
        return self

    def explicit_policy(self) -> NetworkPolicy | None:
        if self.network_mode is None:
            return None
        return NetworkPolicy(network_mode=self.network_mode, allowed_hosts=tuple(self.allowed_hosts or ()))


class Author(BaseModel):
    name: str
    email: str | None = None


class TaskSection(BaseModel):
    """`[task]`: the task as a registry package (Harbor's PackageInfo)."""

    model_config = _SECTION_CONFIG

    name: str
    """`org/name`, e.g. `harbor-rl/fix-pagination` (Harbor's registry format)."""
    version: str | None = Field(default=None, min_length=1)
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_slash_name(cls, value: str) -> str:
        if not _ORG_NAME_RE.match(value) or ".." in value:
            raise ValueError(
                f"a task name is 'org/name' (letters, digits, '.', '_', '-'), e.g. 'my-org/{_slug(value)}'"
            )
        return value


def _slug(value: str) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", value).strip("-._").lower() or "my-task"


class HealthcheckConfig(BaseModel):
    """Readiness check run after the sandbox starts (Docker HEALTHCHECK semantics)."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class TpuSpec(BaseModel):
    type: str = Field(min_length=1)
    topology: str

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str) -> str:
        if not _TOPOLOGY_RE.match(value.strip()):
            raise ValueError(f"invalid TPU topology {value!r}: write dimensions such as '2x4' or '2x2x1'")
        return value.strip()


class MCPServerConfig(BaseModel):
    """An MCP server the agent may use (`[[environment.mcp_servers]]`)."""

    name: str
    transport: MCPTransport = "sse"
    url: str | None = None
    """For `sse` and `streamable-http`."""
    command: str | None = None
    """For `stdio`."""
    args: list[str] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict, exclude_if=lambda value: not value)

    @field_validator("transport", mode="before")
    @classmethod
    def _http_alias(cls, value: Any) -> Any:
        return "streamable-http" if value == "http" else value

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME_RE.fullmatch(name):
                raise ValueError(f"invalid MCP HTTP header name {name!r}")
            if "\r" in value or "\n" in value:
                raise ValueError(f"MCP HTTP header {name!r} must not contain newlines")
        return headers

    @model_validator(mode="after")
    def _transport_fields(self) -> MCPServerConfig:
        if self.transport in ("sse", "streamable-http") and not self.url:
            raise ValueError(f"'url' is required for transport '{self.transport}'")
        if self.transport == "stdio" and not self.command:
            raise ValueError("'command' is required for transport 'stdio'")
        if self.transport == "stdio" and self.headers:
            raise ValueError("'headers' is only supported for HTTP MCP transports")
        return self


class ArtifactConfig(BaseModel):
    """A path collected from the sandbox into the trial folder after the run."""

    source: str
    """Container path (a file or a folder)."""
    destination: str | None = None
    """Where under the trial's `artifacts/` it lands; None mirrors `source` (`/app/x` -> `app/x`)."""
    exclude: list[str] = Field(default_factory=list)
    """tar --exclude patterns for a folder."""
    service: str | None = None
    """Compose service to collect from; None or 'main' is the agent's sandbox."""

    @field_validator("service")
    @classmethod
    def _service(cls, value: str | None) -> str | None:
        return _service_name(value)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if ".." in PurePosixPath(value).parts:
            raise ValueError(f"artifact source must not contain '..' components, got {value!r}")
        return value

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if not value:
            return None
        path = PurePosixPath(value)
        if "\\" in value or path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(
                f"artifact destination must be a relative path with '/' separators, got {value!r}"
            )
        if value.rstrip("/") == "manifest.json":
            raise ValueError("artifact destination 'manifest.json' is reserved for the collection manifest")
        return value

    @model_validator(mode="after")
    def _sidecar_source_absolute(self) -> ArtifactConfig:
        if self.service not in (None, MAIN_SERVICE) and not self.source.startswith("/"):
            raise ValueError(
                f"artifact source {self.source!r} collected from service {self.service!r} must be an absolute path"
            )
        return self


def artifact_entries(entries: list[str | ArtifactConfig]) -> list[ArtifactConfig]:
    """String entries as `ArtifactConfig`, Harbor's convention folder first unless listed explicitly."""
    normalized = [ArtifactConfig(source=e) if isinstance(e, str) else e for e in entries]
    explicit = any(
        a.source.rstrip("/") == ARTIFACTS_CONVENTION_DIR and (a.service or MAIN_SERVICE) == MAIN_SERVICE
        for a in normalized
    )
    return normalized if explicit else [ArtifactConfig(source=ARTIFACTS_CONVENTION_DIR), *normalized]


class VerifierCollectConfig(BaseModel):
    """`[[verifier.collect]]`: a command run in a compose service after the agent phase."""

    command: str
    service: str = MAIN_SERVICE
    timeout_sec: float = 60.0
    user: str | int | None = None

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        checked = _service_name(value)
        if not checked:
            raise ValueError("collect hook service must not be empty")
        return checked


class EnvironmentConfig(_PhaseNetwork):
    """`[environment]`: the sandbox the agent works in."""

    network_mode: NetworkMode = "public"
    """public: anything; no-network: nothing but the model endpoint; allowlist: that plus `allowed_hosts`."""
    build_timeout_sec: float = 600.0
    """Seconds building the image from `environment/` may take."""
    docker_image: str | None = None
    """A prebuilt image to use instead of building `environment/` (its Dockerfile is then optional)."""
    os: TaskOS = "linux"
    cpus: int | float | None = None
    """CPUs the sandbox may use; None: the run's default (Harbor: the backend's, no limit)."""
    memory_mb: int | None = None
    """Memory limit in MiB; None: the run's default."""
    storage_mb: int | None = None
    """Disk limit in MiB where the backend can enforce one; None: the run's default."""
    gpus: int | None = None
    """GPUs to attach; None or 0 attaches none."""
    gpu_types: list[str] | None = None
    tpu: TpuSpec | None = None
    mcp_servers: list[MCPServerConfig] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set in the sandbox; `${VAR}` and `${VAR:-default}` are read from the host at run time."""
    skills_dir: str | None = None
    """A folder in the sandbox whose skills are copied to the agent's own skills folder."""
    healthcheck: HealthcheckConfig | None = None
    workdir: str | None = None
    """Where commands run; None: the image's WORKDIR."""
    allow_internet: bool | None = Field(default=None, exclude=True)
    """Legacy spelling of network_mode (true: public, false: no-network); applied, then cleared."""
    pids_limit: int = Field(default=512, gt=0)
    """Most processes the sandbox may run at once (a Harbor-RL extension; contains fork bombs)."""

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: int | float | None) -> int | float | None:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"cpus must be a finite number, got {value}")
            if value.is_integer():
                return int(value)
        return value

    @field_validator("os", mode="before")
    @classmethod
    def _os_lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _legacy_sizes(cls, data: Any) -> Any:
        # As Harbor: a string size maps onto *_mb (a conflicting *_mb is an error); any other value of
        # the legacy key is dropped.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for legacy, current in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy not in data:
                continue
            value = data.pop(legacy)
            if isinstance(value, str):
                mb = parse_size_mb(value)
                if current in data and data[current] != mb:
                    raise ValueError(
                        f"conflicting {legacy} = {value!r} ({mb} MB) and {current} = {data[current]!r}"
                    )
                data.setdefault(current, mb)
        return data

    def baseline_policy(self) -> NetworkPolicy:
        return NetworkPolicy(network_mode=self.network_mode, allowed_hosts=tuple(self.allowed_hosts or ()))


class AgentConfig(_PhaseNetwork):
    """`[agent]`: the agent's phase."""

    timeout_sec: float | None = None
    """Seconds the agent may run; None: the run's default."""
    user: str | int | None = None
    """User the agent runs as; None: the image's USER."""


class VerifierConfig(_PhaseNetwork):
    """`[verifier]`: how the task's tests run after the agent stops."""

    timeout_sec: float = 600.0
    """Seconds `tests/test.sh` may run before it is killed and the reward is None."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for `test.sh` (`${VAR}` templates as in [environment] env)."""
    user: str | int | None = None
    """User the tests run as; None: the image's USER."""
    environment_mode: Literal["shared", "separate"] | None = None
    """shared: the tests run in the agent's sandbox; separate: in a container of their own."""
    environment: EnvironmentConfig | None = None
    collect: list[VerifierCollectConfig] = Field(default_factory=list)
    reward_key: str | None = None
    """Which key of a multi-metric reward.json trains (a Harbor-RL extension; see the verifier)."""

    @model_validator(mode="after")
    def _mode_matches_environment(self) -> VerifierConfig:
        if self.environment_mode == "shared" and self.environment is not None:
            raise ValueError(
                "[verifier] environment_mode = 'shared' conflicts with [verifier.environment]; "
                "drop the environment or set environment_mode = 'separate'"
            )
        return self

    def mode(self) -> Literal["shared", "separate"] | None:
        """The mode this section asks for, before inheritance (an environment implies separate)."""
        if self.environment_mode is not None:
            return self.environment_mode
        return "separate" if self.environment is not None else None


class SolutionConfig(BaseModel):
    """`[solution]`: how the oracle `solution/solve.sh` runs."""

    model_config = _SECTION_CONFIG

    env: dict[str, str] = Field(default_factory=dict)


class StepConfig(BaseModel):
    """One `[[steps]]` entry: an instruction, its own tests and limits, in the same sandbox."""

    model_config = _SECTION_CONFIG

    name: str
    """The step's folder under `steps/`."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    min_reward: float | dict[str, float] | None = None
    """Stop the remaining steps when this step's reward is below it (a dict: per key)."""
    healthcheck: HealthcheckConfig | None = None
    artifacts: list[str | ArtifactConfig] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _portable_name(cls, name: str) -> str:
        if (
            not name.strip()
            or name in {".", ".."}
            or name.endswith((".", " "))
            or _BAD_STEP_CHARS.search(name)
            or _WINDOWS_DEVICE.fullmatch(name.partition(".")[0].rstrip(" "))
        ):
            raise ValueError(
                f"invalid step name {name!r}: a step name is one portable folder name "
                "(no '/', control or reserved characters, no trailing dot or space)"
            )
        if len(name.encode("utf-8")) > 255:
            raise ValueError("step names must be at most 255 UTF-8 bytes")
        return name


class TaskConfig(BaseModel):
    """One `task.toml`."""

    model_config = _SECTION_CONFIG

    schema_version: str = HARBOR_SCHEMA_VERSION
    task: TaskSection | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: str | None = None
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    """How per-step rewards make the task's: per-key mean (the default), or the last step's."""
    steps: list[StepConfig] | None = None
    artifacts: list[str | ArtifactConfig] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _legacy_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            version = data.pop("version")
            data.setdefault("schema_version", version)
        return data

    @field_validator("schema_version")
    @classmethod
    def _supported_schema(cls, value: str) -> str:
        if value.split(".", 1)[0] != str(SUPPORTED_SCHEMA_MAJOR):
            raise ValueError(f"schema version {value!r} is not supported; this reader knows 1.x")
        return value

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, steps: list[StepConfig] | None) -> list[StepConfig] | None:
        seen: set[str] = set()
        for step in steps or []:
            key = unicodedata.normalize("NFC", step.name).casefold()
            if key in seen:
                raise ValueError(f"step names must be unique (ignoring case): {step.name!r} appears twice")
            seen.add(key)
        return steps

    @model_validator(mode="after")
    def _artifact_entries_valid(self) -> TaskConfig:
        # A string entry is an ArtifactConfig's source, checked as one (Harbor's validate_artifact_structure).
        for entries in [self.artifacts] + [step.artifacts for step in self.steps or []]:
            artifact_entries(entries)
        return self

    @model_validator(mode="after")
    def _apply_allow_internet(self) -> TaskConfig:
        # Harbor applies the legacy flag after validation, only where no policy was written explicitly.
        sections = [self.environment, self.verifier.environment]
        sections += [step.verifier.environment for step in self.steps or []]
        for section in sections:
            if section is None or section.allow_internet is None:
                continue
            if "network_mode" not in section.model_fields_set and section.allowed_hosts is None:
                section.network_mode = "public" if section.allow_internet else "no-network"
            section.allow_internet = None
        return self

    @property
    def has_steps(self) -> bool:
        return bool(self.steps)

    def unknown_keys(self) -> list[str]:
        """Dotted paths of every key this model kept without knowing it."""
        found = list(self.model_extra or {})
        for section in ("task", "verifier", "agent", "environment", "solution"):
            value = getattr(self, section)
            if value is not None:
                found.extend(f"{section}.{key}" for key in value.model_extra or {})
        for index, step in enumerate(self.steps or []):
            found.extend(f"steps[{index}].{key}" for key in step.model_extra or {})
        return sorted(found)
