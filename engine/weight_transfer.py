"""Server side of vLLM's weight-transfer protocol, carried over torch.distributed with gloo.

The sequence (docs/design.md 3.9) is vLLM's: `init_weight_transfer_engine` joins a process group as rank
`rank_offset` while the trainer joins as rank 0; each sync is `start_weight_update`, one or more
`update_weights` (the trainer broadcasts the tensors while the HTTP call is in flight), then
`finish_weight_update`. Received tensors are only *staged*; finish applies them all at once between two
generation steps and bumps the weight version. Any failure (bad names or shapes, a transport error)
discards the staging: the engine keeps serving the old weights.

The group is a stateless `ProcessGroupGloo` over its own TCPStore, like vLLM's StatelessProcessGroup, so
it never touches a default torch.distributed group the host process may own.
"""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from engine.errors import BadRequest, WeightTransferError, WeightTransferStateError
from engine.scheduler import BatchScheduler

log = logging.getLogger(__name__)

DEFAULT_PACKED_BUFFER_SIZE_BYTES = 64 * 1024 * 1024


def gloo_group(master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float):
    """Join (rank 0: host) a gloo group of `world_size` over a fresh TCPStore."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, int(master_port), world_size, rank == 0, timeout=timeout)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BadRequest(f"update_info.dtype_names: unknown torch dtype {name!r}", param="update_info")
    return dtype


def pack_plan(dtype_names: list[str], shapes: list[list[int]], buffer_size_bytes: int) -> list[list[int]]:
    """Group tensor indices into broadcast buffers of at most `buffer_size_bytes` (a bigger tensor
    goes alone). Trainer and engine derive the same plan from the same update_info."""
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, (dtype_name, shape) in enumerate(zip(dtype_names, shapes, strict=True)):
        size = torch.Size(shape).numel() * torch_dtype(dtype_name).itemsize
        if current and used + size > buffer_size_bytes:
            chunks.append(current)
            current, used = [], 0
        current.append(i)
        used += size
    if current:
        chunks.append(current)
    return chunks


@dataclass
class UpdateInfo:
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    packed: bool = False
    packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES

    @classmethod
    def parse(cls, raw: Any) -> UpdateInfo:
        if not isinstance(raw, dict):
            raise BadRequest("update_info must be a JSON object", param="update_info")
        try:
            names, dtypes, shapes = raw["names"], raw["dtype_names"], raw["shapes"]
        except KeyError as exc:
            raise BadRequest(f"update_info is missing {exc.args[0]!r}", param="update_info") from None
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
            raise BadRequest("update_info names, dtype_names and shapes must be lists", param="update_info")
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest(
                f"update_info lists differ in length: {len(names)} names, {len(dtypes)} dtype_names, "
                f"{len(shapes)} shapes",
                param="update_info",
            )
        for dtype in dtypes:
            torch_dtype(dtype)
        return cls(
            names=names,
            dtype_names=dtypes,
            shapes=[list(s) for s in shapes],
            packed=bool(raw.get("packed", False)),
            packed_buffer_size_bytes=int(
                raw.get("packed_buffer_size_bytes", DEFAULT_PACKED_BUFFER_SIZE_BYTES)
            ),
        )


def receive_tensors(group, info: UpdateInfo) -> list[torch.Tensor]:
    """Receive every tensor the trainer broadcasts for `info`, in order (packed or one by one)."""
    if not info.packed:
        tensors = []
        for dtype, shape in zip(info.dtype_names, info.shapes, strict=True):
            tensor = torch.empty(shape, dtype=torch_dtype(dtype))
            group.broadcast(tensor, 0).wait()
            tensors.append(tensor)
        return tensors
    tensors: list[torch.Tensor] = [torch.empty(0)] * len(info.names)
    for chunk in pack_plan(info.dtype_names, info.shapes, info.packed_buffer_size_bytes):
        sizes = [
            torch.Size(info.shapes[i]).numel() * torch_dtype(info.dtype_names[i]).itemsize for i in chunk
        ]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        group.broadcast(buffer, 0).wait()
        for i, part in zip(chunk, torch.split(buffer, sizes), strict=True):
            tensors[i] = part.view(torch_dtype(info.dtype_names[i])).reshape(info.shapes[i]).clone()
    return tensors


class WeightReceiver:
    """The engine's end of the weight-transfer protocol; every method blocks (run it in a thread)."""

    world_size = 1
    """Ranks this engine contributes to the group (vLLM: TP * PP * DP)."""

    def __init__(self, scheduler: BatchScheduler, timeout_s: float = 300.0) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self._group = None
        self._lock = threading.Lock()
        self._staged: dict[str, torch.Tensor] | None = None
        self._failure: str | None = None

    def init(self, init_info: Any) -> None:
        if not isinstance(init_info, dict):
            raise BadRequest("init_info must be a JSON object", param="init_info")
        missing = [
            k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in init_info
        ]
        if missing:
            raise BadRequest(f"init_info is missing {', '.join(missing)}", param="init_info")
        rank, world_size = int(init_info["rank_offset"]), int(init_info["world_size"])
        if not 0 < rank < world_size or rank + self.world_size > world_size:
            raise BadRequest(
                f"init_info: rank_offset {rank} with this engine's {self.world_size} rank(s) does not fit "
                f"world_size {world_size} (the trainer is rank 0)",
                param="init_info",
            )
        with self._lock:
            try:
                self._group = gloo_group(
                    init_info["master_address"], init_info["master_port"], rank, world_size, self.timeout_s
                )
            except (RuntimeError, ValueError) as exc:
                raise WeightTransferError(f"cannot join the weight-transfer group: {exc}") from exc
        log.info("joined weight-transfer group as rank %d of %d", rank, world_size)

    def start(self, is_checkpoint_format: bool = True) -> None:
        if not is_checkpoint_format:
            raise BadRequest(
                "is_checkpoint_format=false (kernel-format weights) is not supported by the embedded engine",
                param="is_checkpoint_format",
            )
        with self._lock:
            if self._group is None:
                raise WeightTransferStateError(
                    "call /init_weight_transfer_engine before /start_weight_update"
                )
            self._staged, self._failure = {}, None

    def update(self, raw_info: Any) -> None:
        info = UpdateInfo.parse(raw_info)
        with self._lock:
            if self._staged is None:
                raise WeightTransferStateError("call /start_weight_update before /update_weights")
            try:
                tensors = receive_tensors(self._group, info)
            except (RuntimeError, ValueError) as exc:
                # The group is unusable after a broken collective: the trainer must init again. The
                # trainer may be gone and never send /resume, so serving resumes on the old weights now.
                self._group, self._failure = None, f"transport failed: {exc}"
                self.scheduler.resume()
                log.warning(
                    "weight transfer broke (%s); serving version %d again", exc, self.scheduler.version
                )
                raise WeightTransferError(f"receiving weights failed: {exc}") from exc
            problem = self._check(info, tensors)
            if problem:
                self._failure = problem
                raise BadRequest(problem, param="update_info")
            self._staged.update(zip(info.names, tensors, strict=True))

    def _check(self, info: UpdateInfo, tensors: list[torch.Tensor]) -> str | None:
        params = self.scheduler.model.state_dict()
        for name, tensor in zip(info.names, tensors, strict=True):
            if name not in params:
                return f"update_info: unknown parameter {name!r}"
            if tuple(tensor.shape) != tuple(params[name].shape):
                return f"update_info: {name} has shape {list(tensor.shape)}, the model has {list(params[name].shape)}"
            if not torch.isfinite(tensor.float()).all():
                return f"update_info: {name} contains non-finite values"
        return None

    def finish(self) -> int:
        """Apply the staged weights atomically and return the new version; on a failed update
        discard them and raise (the old weights stay)."""
        with self._lock:
            staged, failure = self._staged, self._failure
            self._staged, self._failure = None, None
        if staged is None:
            raise WeightTransferStateError("call /start_weight_update before /finish_weight_update")
        if failure is not None:
            raise WeightTransferError(
                f"weight update discarded, still serving version {self.scheduler.version}: {failure}"
            )

        def apply(model: torch.nn.Module) -> None:
            params = model.state_dict()
            for name, tensor in staged.items():
                params[name].copy_(tensor.to(params[name].dtype))

        return self.scheduler.apply_weights(apply)
