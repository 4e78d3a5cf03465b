"""Server side of vLLM's weight-transfer protocol, carried over torch.distributed with gloo.

The sequence (docs/design.md 3.9) is vLLM's: `init_weight_transfer_engine` joins a process group as rank
`rank_offset` while the trainer joins as rank 0; each sync is `start_weight_update`, one or more
`update_weights` (the trainer broadcasts the tensors while the HTTP call is in flight), then
`finish_weight_update`. Received tensors are only *staged*; finish applies them all at once between two
generation steps. Any failure (bad names or shapes, a transport error) discards the staging and ends the
update, as vLLM's worker ends it: the engine keeps its old weights, whole (vLLM may hold part of the new
ones), and answers 500 as vLLM does (docs/design.md 3.9 has the route table).

Read against vLLM 0.28.0 and 0.33.0 (the range pyproject pins), NCCL backend:
- `init_info` is `NCCLWeightTransferInitInfo` (`vllm/distributed/weight_transfer/nccl_common.py`):
  master_address, master_port, rank_offset, world_size, and the wire params packed (default False),
  packed_buffer_size_bytes (1 GiB), packed_num_buffers (2). `packed` lives here, not in update_info, since
  0.28 (vllm-project/vllm#50902); unknown keys are refused (`parse_init_info` builds the dataclass).
- `update_info` is `NCCLWeightTransferUpdateInfo` (`nccl_engine.py`): names, dtype_names, shapes, all of
  one length; nothing else.
- packed chunks are cut by `pack_tensors` / `packed_nccl_broadcast_consumer` (`packed_tensor.py`): add
  tensors until the running size *exceeds* the buffer size, then send; so both ends cut the same chunks.
- the weight version is a tag the trainer gives, never a counter (`vllm/v1/engine/core.py` starts it at
  "default"; `AsyncLLM.finish_weight_update(weight_version)` sets it only when one is given).

The group is a stateless `ProcessGroupGloo` over its own TCPStore, like vLLM's StatelessProcessGroup, so
it never touches a default torch.distributed group the host process may own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from engine.errors import BadRequest, WeightTransferError, WeightTransferStateError
from engine.scheduler import BatchScheduler
from harbor_rl_vllm import wire
from harbor_rl_vllm.wire import DEFAULT_PACKED_BUFFER_SIZE_BYTES, gloo_group

log = logging.getLogger(__name__)

DEFAULT_PACKED_NUM_BUFFERS = 2


def torch_dtype(name: str) -> torch.dtype:
    try:
        return wire.torch_dtype(name)
    except ValueError as exc:
        raise BadRequest(str(exc), param="update_info") from None


class _WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def parse(cls, raw: Any, param: str):
        if not isinstance(raw, dict):
            raise BadRequest(f"{param} must be a JSON object", param=param)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or param}: {e['msg']}" for e in exc.errors()
            )
            raise BadRequest(f"Invalid {param}: {problems}", param=param) from None


class InitInfo(_WireModel):
    """vLLM's `NCCLWeightTransferInitInfo` (TCP rendezvous; the torch-free unique-id mode of 0.33 is
    not offered by a gloo group)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = False
    packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
    packed_num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS


class UpdateInfo(_WireModel):
    """vLLM's `NCCLWeightTransferUpdateInfo`."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    @model_validator(mode="after")
    def _same_lengths(self) -> UpdateInfo:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )
        for dtype in self.dtype_names:
            torch_dtype(dtype)
        return self


def receive_tensors(group, info: UpdateInfo, wire_info: InitInfo) -> list[torch.Tensor]:
    """Receive every tensor the trainer broadcasts for `info`, in order (packed or one by one, as the
    init handshake agreed), each a tensor of its own (staged until the finish)."""
    tensors: list[torch.Tensor] = [torch.empty(0)] * len(info.names)
    received = wire.receive(
        group, info.dtype_names, info.shapes, wire_info.packed, wire_info.packed_buffer_size_bytes
    )
    for i, tensor in received:
        tensors[i] = tensor.clone() if wire_info.packed else tensor  # a packed part is a view of its buffer
    return tensors


class WeightReceiver:
    """The engine's end of the weight-transfer protocol; every method blocks (run it in a thread).

    Its bookkeeping is vLLM's worker's (`Worker` in `vllm/v1/worker/gpu_worker.py`): a start opens an
    update (a second start while one is open is refused), an update outside one is refused, a failed
    update closes it, and a finish needs an open one. Errors are WeightTransferError (HTTP 500, as vLLM
    answers every failure inside its engine). Unlike vLLM, which loads tensors layer by layer as they
    arrive, the embedded engine stages them and applies them whole at the finish, so a failed update
    leaves its previous weights untouched."""

    world_size = 1
    """Ranks this engine contributes to the group (vLLM: TP * PP * DP)."""

    def __init__(self, scheduler: BatchScheduler, timeout_s: float = 300.0) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self._group = None
        self._wire: InitInfo | None = None
        self._lock = threading.Lock()
        self._staged: dict[str, torch.Tensor] | None = None
        """The open update's tensors (None: no update open)."""

    def init(self, raw_info: dict[str, Any]) -> None:
        info = _parsed(InitInfo, raw_info, "init_info")
        rank, world_size = info.rank_offset, info.world_size
        if not 0 < rank < world_size or rank + self.world_size > world_size:
            raise WeightTransferError(
                f"init_info: rank_offset {rank} with this engine's {self.world_size} rank(s) does not fit "
                f"world_size {world_size} (the trainer is rank 0)"
            )
        with self._lock:
            try:
                self._group = gloo_group(
                    info.master_address, info.master_port, rank, world_size, self.timeout_s
                )
            except (RuntimeError, ValueError) as exc:
                raise WeightTransferError(
                    f"cannot join the weight-transfer group at {info.master_address}:{info.master_port} "
                    f"(is that address reachable from the engine?): {exc}"
                ) from exc
            self._wire = info
        log.info("joined weight-transfer group as rank %d of %d (packed=%s)", rank, world_size, info.packed)

    def start(self) -> None:
        """vLLM's /start_weight_update takes no arguments (a body such as TRL's
        `{"is_checkpoint_format": true}` is ignored there and here), and needs no group yet."""
        with self._lock:
            if self._staged is not None:
                raise WeightTransferStateError(
                    "start_weight_update called while a weight update is already active. Call "
                    "finish_weight_update first."
                )
            self._staged = {}

    def update(self, raw_info: dict[str, Any]) -> None:
        with self._lock:
            if self._staged is None:
                raise WeightTransferStateError("start_weight_update must be called before update_weights.")
            try:
                self._receive(raw_info)
            except BaseException:
                self._staged = None  # vLLM's worker ends the update on any failure
                raise

    def _receive(self, raw_info: dict[str, Any]) -> None:
        info = _parsed(UpdateInfo, raw_info, "update_info")
        if self._group is None:
            raise WeightTransferStateError(
                "weight transfer not initialized: call /init_weight_transfer_engine first"
            )
        try:
            tensors = receive_tensors(self._group, info, self._wire)
        except (RuntimeError, ValueError) as exc:
            # The group is unusable after a broken collective: the trainer must init again. The
            # trainer may be gone and never send /resume, so serving resumes on the old weights now.
            self._group = None
            self.scheduler.resume()
            log.warning("weight transfer broke (%s); serving %r again", exc, self.scheduler.weight_version)
            raise WeightTransferError(f"receiving weights failed: {exc}") from exc
        problem = self._check(info, tensors)
        if problem:
            raise WeightTransferError(problem)
        self._staged.update(zip(info.names, tensors, strict=True))

    def _check(self, info: UpdateInfo, tensors: list[torch.Tensor]) -> str | None:
        params = self.scheduler.model.state_dict()
        for name, tensor in zip(info.names, tensors, strict=True):
            if name not in params:
                return f"update_info: unknown parameter {name!r}"
            # vLLM's default_weight_loader loads a one-element tensor into any one-element parameter
            # (a 0-dim one travels as shape [1]); otherwise the shapes must agree.
            same = tuple(tensor.shape) == tuple(params[name].shape) or tensor.numel() == params[name].numel() == 1
            if not same:
                return f"update_info: {name} has shape {list(tensor.shape)}, the model has {list(params[name].shape)}"
            if not torch.isfinite(tensor.float()).all():
                return f"update_info: {name} contains non-finite values"
        return None

    def finish(self, weight_version: str | None = None) -> None:
        """Apply the open update's tensors at once and, when a tag is given, make it the served weight
        version (vLLM keeps its tag otherwise)."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is None:
            raise WeightTransferStateError(
                "finish_weight_update called without a matching start_weight_update (or the update failed; "
                f"still serving weight version {self.scheduler.weight_version!r})"
            )

        def apply(model: torch.nn.Module) -> None:
            params = model.state_dict()
            for name, tensor in staged.items():
                params[name].copy_(tensor.to(params[name].dtype).view(params[name].shape))

        self.scheduler.apply_weights(apply, weight_version)


def _parsed(model: type[_WireModel], raw: dict[str, Any], param: str):
    """vLLM checks init_info and update_info inside its engine (`parse_init_info`,
    `parse_update_info`), so a bad one is a 500 there, not a 400."""
    try:
        return model.parse(raw, param)
    except BadRequest as exc:
        raise WeightTransferError(exc.message) from None
