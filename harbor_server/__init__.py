"""The rollout server (`harbor serve`) and its Python client.

    from harbor_server import HarborSessionFactory
    factory = HarborSessionFactory("http://localhost:8200", split="builtin", harness="oracle",
                                   sandbox="local", llm_url="http://localhost:8000/v1", model="tiny")
    session = factory.create(0, seed=1, episode_id="g0-0")
    session.verify().env_reward            # 1.0 (None would mean unscoreable)

The server side is public API too, imported on first use so a trainer that only uses the client does
not load FastAPI, the sandboxes or the tasks:

    from harbor_server import ServeConfig, running_server, free_port
    with running_server(ServeConfig(datasets=["builtin"], port=free_port(), ...)) as server:
        factory = HarborSessionFactory(server.url, ...)

`HarborServer` (what `harbor serve` runs), `running_server` / `ServerThread` (the same server in a
background thread of this process, as `harbor train` and `harbor eval` start it), `free_port`, and
`load_datasets` (the `--dataset` specs as splits).
"""

import importlib
from typing import Any

from harbor_server.client import (
    AsyncHarborClient,
    AsyncHarborSession,
    AsyncHarborSessionFactory,
    HarborClient,
    HarborSession,
    HarborSessionFactory,
    VerifyResult,
)
from harbor_server.config import ServeConfig
from harbor_server.errors import (
    BadRolloutRequest,
    CapacityExceeded,
    EngineCheckFailed,
    HarborServerError,
    RolloutNotFinished,
    RolloutNotFound,
    ServerUnreachable,
    TraceNotTrainable,
    TunnelError,
)
from harbor_server.models import RolloutRequest, RolloutResult, RolloutState, ServerInfo

_SERVER_SIDE = {
    "HarborServer": "harbor_server.server",
    "load_datasets": "harbor_server.server",
    "ServerThread": "harbor_server.embedded",
    "free_port": "harbor_server.embedded",
    "running_server": "harbor_server.embedded",
}


def __getattr__(name: str) -> Any:
    if name in _SERVER_SIDE:
        return getattr(importlib.import_module(_SERVER_SIDE[name]), name)
    raise AttributeError(f"module 'harbor_server' has no attribute {name!r}")


__all__ = [
    "AsyncHarborClient",
    "AsyncHarborSession",
    "AsyncHarborSessionFactory",
    "BadRolloutRequest",
    "CapacityExceeded",
    "EngineCheckFailed",
    "HarborClient",
    "HarborServer",
    "HarborServerError",
    "HarborSession",
    "HarborSessionFactory",
    "RolloutNotFinished",
    "RolloutNotFound",
    "RolloutRequest",
    "RolloutResult",
    "RolloutState",
    "ServeConfig",
    "ServerThread",
    "ServerInfo",
    "ServerUnreachable",
    "TraceNotTrainable",
    "TunnelError",
    "VerifyResult",
    "free_port",
    "load_datasets",
    "running_server",
]
