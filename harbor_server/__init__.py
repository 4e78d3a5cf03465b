"""The rollout server (`harbor serve`) and its Python client.

    from harbor_server import HarborSessionFactory
    factory = HarborSessionFactory("http://localhost:8200", split="builtin", harness="oracle",
                                   sandbox="local", llm_url="http://localhost:8000/v1", model="tiny")
    session = factory.create(0, seed=1, episode_id="g0-0")
    session.verify().env_reward            # 1.0 (None would mean unscoreable)

The server side (`harbor_server.server.HarborServer`, `harbor_server.app`) is imported on demand, so
a trainer that only uses the client does not load FastAPI, the sandboxes or the tasks.
"""

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
)
from harbor_server.models import RolloutRequest, RolloutResult, RolloutState, ServerInfo

__all__ = [
    "AsyncHarborClient",
    "AsyncHarborSession",
    "AsyncHarborSessionFactory",
    "BadRolloutRequest",
    "CapacityExceeded",
    "EngineCheckFailed",
    "HarborClient",
    "HarborServerError",
    "HarborSession",
    "HarborSessionFactory",
    "RolloutNotFinished",
    "RolloutNotFound",
    "RolloutRequest",
    "RolloutResult",
    "RolloutState",
    "ServeConfig",
    "ServerInfo",
    "ServerUnreachable",
    "TraceNotTrainable",
    "VerifyResult",
]
