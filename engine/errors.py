"""Errors of the embedded engine, in one hierarchy.

Request errors carry the HTTP status and the vLLM error `type` they are reported with, so the server
turns every one of them into vLLM's `{"error": {"message", "type", "param", "code"}}` body in one place.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class for embedded-engine failures."""


class ModelBuildError(EngineError):
    """The tiny model could not be built, or a model folder could not be loaded."""


class EngineConfigError(EngineError):
    """The engine cannot be set up as configured (a missing GPU, ...)."""


class VllmNotInstalled(EngineConfigError):
    """`harbor engine --backend vllm`: the vLLM venv (scripts/vllm_env.sh) is missing or half-built."""


class VllmStartError(EngineConfigError):
    """`harbor engine --backend vllm`: vLLM exited, or did not answer /health in time, while starting."""


class RequestError(EngineError):
    """A request the engine refuses; `status` and `err_type` follow vLLM's ErrorResponse."""

    status = 400
    err_type = "BadRequestError"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(RequestError):
    """Malformed or unsatisfiable request (HTTP 400)."""


class ModelNotFound(RequestError):
    """The request names a model this engine does not serve (HTTP 404, as vLLM answers)."""

    status = 404
    err_type = "NotFoundError"

    def __init__(self, model: str):
        super().__init__(f"The model `{model}` does not exist.", param="model")


class WeightTransferError(EngineError):
    """A weight-transfer step failed; the engine keeps serving its previous weights."""


class WeightTransferStateError(WeightTransferError):
    """A weight-transfer endpoint was called out of order (e.g. update before init)."""


class EngineStopped(EngineError):
    """The generation loop is not running (server shutting down)."""


class WeightSyncError(EngineError):
    """The trainer could not push its weights to the inference engine (client side of the protocol).

    `step` names the call that failed (e.g. "POST /update_weights"); `paused` says whether the engine
    was left paused (True: it may hold part of the new weights, and nothing may sample from it)."""

    def __init__(self, message: str, *, step: str | None = None, paused: bool = False) -> None:
        super().__init__(message)
        self.step = step
        self.paused = paused
