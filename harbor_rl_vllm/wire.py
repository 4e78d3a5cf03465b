"""The gloo backend's wire format (torch only): the same tensors, in the same order and the same packed
chunks, as vLLM's NCCL backend sends them, so one trainer-side sender serves both.

Chunks are cut as `pack_tensors` / `packed_nccl_broadcast_consumer` cut them
(`vllm/distributed/weight_transfer/packed_tensor.py`): tensors are added until the running size *exceeds*
the buffer size, and the tensor that crossed the line closes the chunk. Harbor-RL's trainer
(engine/weight_client.py, `GlooTransport`) cuts them with the same rule (engine/weight_transfer.py,
`pack_plan`); the embedded engine receives with this module too.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

DEFAULT_PACKED_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024
"""vLLM's (`packed_tensor.py`), used when init_info names none."""


def gloo_group(master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float):
    """Join the trainer's group (the trainer, rank 0, hosts the TCPStore) as a stateless ProcessGroupGloo:
    no default torch.distributed group is touched, as vLLM's StatelessProcessGroup touches none."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(master_address, int(master_port), world_size, rank == 0, timeout=timeout)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"update_info.dtype_names: unknown torch dtype {name!r}")
    return dtype


def nbytes(dtype_name: str, shape: list[int]) -> int:
    return torch.Size(shape).numel() * torch_dtype(dtype_name).itemsize


def pack_plan(dtype_names: list[str], shapes: list[list[int]], buffer_size_bytes: int) -> list[list[int]]:
    """Tensor indices per broadcast buffer."""
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, (dtype_name, shape) in enumerate(zip(dtype_names, shapes, strict=True)):
        current.append(i)
        used += nbytes(dtype_name, shape)
        if used > buffer_size_bytes:
            chunks.append(current)
            current, used = [], 0
    if current:
        chunks.append(current)
    return chunks


def receive(group, dtype_names: list[str], shapes: list[list[int]], packed: bool, buffer_size_bytes: int):
    """Yield the index and tensor of each broadcast from rank 0, in order, as they arrive (so the caller
    loads layer by layer, as vLLM's NCCL consumer does, rather than holding the whole model twice)."""
    if not packed:
        for i, (dtype, shape) in enumerate(zip(dtype_names, shapes, strict=True)):
            tensor = torch.empty(shape, dtype=torch_dtype(dtype))
            group.broadcast(tensor, 0).wait()
            yield i, tensor
        return
    for chunk in pack_plan(dtype_names, shapes, buffer_size_bytes):
        sizes = [nbytes(dtype_names[i], shapes[i]) for i in chunk]
        buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        group.broadcast(buffer, 0).wait()
        for i, part in zip(chunk, torch.split(buffer, sizes), strict=True):
            yield i, part.view(torch_dtype(dtype_names[i])).reshape(shapes[i])
