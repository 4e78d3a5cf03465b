"""Errors of the rollout server and its client, in one hierarchy.

Server-side errors carry the HTTP status they are answered with, so a bad request becomes a 4xx
whose message names the field and the value at fault. The client raises the same classes, rebuilt
from the server's answer, so a trainer sees one error vocabulary whichever side found the problem.
"""

from __future__ import annotations

from typing import Any


class HarborServerError(Exception):
    """Base class for rollout-server failures; `status` is the HTTP status it is answered with."""

    status: int = 500

    def __init__(self, message: str, *, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.detail = detail


class BadRolloutRequest(HarborServerError):
    """A rollout request names something the server does not have (split, task, harness, sandbox...)."""

    status = 400


class TaskIndexOutOfRange(BadRolloutRequest):
    status = 404


class RolloutNotFound(HarborServerError):
    status = 404

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"no rollout with id {rollout_id!r}")


class CapacityExceeded(HarborServerError):
    """More live rollouts were asked for than MAX_CONCURRENT_ENVS allows."""

    status = 429


class RolloutNotFinished(HarborServerError):
    """The result of a rollout that is still running was asked for."""

    status = 409


class TraceNotTrainable(HarborServerError):
    """The rollout's trace has FATAL findings; `findings` lists them."""

    status = 409

    def __init__(self, message: str, findings: list[dict[str, Any]]) -> None:
        super().__init__(message, detail=findings)
        self.findings = findings


class EngineCheckFailed(HarborServerError):
    """The inference engine is unreachable or not in the mode training needs (found at start-up)."""

    status = 503


class TunnelError(HarborServerError):
    """`--expose cloudflare|gradio` could not open its tunnel to the capture port (found at start-up)."""

    status = 503


class ServerUnreachable(HarborServerError):
    """The client could not reach the rollout server at all."""

    status = 503


class StartRefused(HarborServerError):
    """The server must not start, and has touched nothing: its port is taken or its server id is held
    by a live server. `flag` names the option that chooses another (a CLI adds it as the hint)."""

    status = 409

    def __init__(self, message: str, *, flag: str) -> None:
        super().__init__(message)
        self.flag = flag


class PortInUse(StartRefused):
    """Another process listens on the trainer-facing or the capture port."""


class ServerIdInUse(StartRefused):
    """Another live server holds this server id on the store (its lock's heartbeat is fresh)."""


class NetworkNotIsolated(StartRefused):
    """A task of the datasets needs a network mode the default sandbox cannot isolate on this machine
    (sandboxes.local.network_refusal): refused at start-up, never run on the host's network."""


class ServerLockLost(HarborServerError):
    """This server's lock on its id was taken over (it missed heartbeats for long enough to look dead)."""
