"""NCCL replaced by an in-memory wire, for vLLM's weight-transfer code on a CPU.

Stands in for the two things `vllm/distributed/weight_transfer/nccl_common.py` builds the group from:
`StatelessProcessGroup.create(host, port, rank, world_size, ...)` (`vllm/distributed/utils.py`: a
TCPStore rendezvous, rank 0 hosting it; here a registry keyed by (host, port) that blocks until
`world_size` ranks have joined, or fails after `store_timeout` as the TCPStore does) and
`PyNcclCommunicator(group, device)` (`vllm/distributed/device_communicators/pynccl.py`), of which vLLM's
weight transfer uses `broadcast(tensor, src, stream=None)`, `rank`, `world_size`, `device` and, in 0.33,
`destroy()`.

Behaviour kept from NCCL, because the failure tests depend on it:
- broadcasts match in call order, one queue per receiving rank;
- the sender's broadcast completes only once every receiver has taken the data (on a GPU the enqueue
  returns at once, and the sender blocks at its next stream synchronize, which vLLM's producer calls
  before every buffer and at the end);
- nothing times out: a sender whose receiver stopped waits forever, and so does a receiver whose sender
  stopped. `close()` (the tests' teardown) ends those waits with an error, as killing the process would;
- the tensor must be on the communicator's device (pynccl.py asserts it).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch


class WireClosed(RuntimeError):
    """The test tore the group down while a rank was blocked in it."""


class _Group:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.joined: set[int] = set()
        self.cond = threading.Condition()
        self.queues: dict[int, list[torch.Tensor]] = {r: [] for r in range(world_size)}
        self.taken = 0
        self.sent = 0
        self.closed = False


_GROUPS: dict[tuple[str, int], _Group] = {}
SENT: list[int] = []
"""Bytes of every broadcast rank 0 made (a test resets it)."""
_GROUPS_LOCK = threading.Lock()


def close_all() -> None:
    """Release every rank blocked in any group (end of a test)."""
    with _GROUPS_LOCK:
        groups = list(_GROUPS.values())
        _GROUPS.clear()
    for group in groups:
        with group.cond:
            group.closed = True
            group.cond.notify_all()


@dataclasses.dataclass
class StatelessProcessGroup:
    rank: int
    world_size: int
    key: tuple[str, int]
    group: Any = None

    @staticmethod
    def create(
        host: str,
        port: int,
        rank: int,
        world_size: int,
        data_expiration_seconds: int = 3600,
        store_timeout: int = 300,
        listen_socket: Any = None,
    ) -> StatelessProcessGroup:
        key = (host, int(port))
        with _GROUPS_LOCK:
            group = _GROUPS.get(key)
            if group is None or group.closed or rank in group.joined:
                group = _GROUPS[key] = _Group(world_size)
        deadline = time.monotonic() + store_timeout
        with group.cond:
            group.joined.add(rank)
            group.cond.notify_all()
            while len(group.joined) < world_size:
                left = deadline - time.monotonic()
                if group.closed or left <= 0:
                    raise RuntimeError(
                        f"Timed out after {store_timeout}s waiting for {world_size} ranks at {host}:{port} "
                        f"(joined: {sorted(group.joined)})"
                    )
                group.cond.wait(min(left, 0.05))
        return StatelessProcessGroup(rank=rank, world_size=world_size, key=key, group=group)


class PyNcclCommunicator:
    def __init__(self, group: StatelessProcessGroup, device: Any, library_path: str | None = None) -> None:
        self.rank = group.rank
        self.world_size = group.world_size
        self.group = group
        self._wire: _Group = group.group
        # pynccl.py binds an int to cuda:<int>; on this machine the data lives on the CPU.
        self.device = torch.device("cpu")
        self.disabled = False

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        assert tensor.device == self.device, (
            f"this nccl communicator is created to work on {self.device}, but the input tensor is on {tensor.device}"
        )
        wire = self._wire
        with wire.cond:
            if self.rank == src:
                payload = tensor.detach().reshape(-1).view(torch.uint8).clone()
                SENT.append(payload.numel())
                target = wire.sent + (self.world_size - 1)
                for rank in range(self.world_size):
                    if rank != src:
                        wire.queues[rank].append(payload)
                wire.sent = target
                wire.cond.notify_all()
                while wire.taken < target:
                    self._wait(wire)
                return
            while not wire.queues[self.rank]:
                self._wait(wire)
            payload = wire.queues[self.rank].pop(0)
            wire.taken += 1
            wire.cond.notify_all()
        flat = tensor.reshape(-1).view(torch.uint8)
        assert flat.numel() == payload.numel(), (
            f"broadcast of {payload.numel()} bytes into a buffer of {flat.numel()}: the two ends cut the stream differently"
        )
        flat.copy_(payload)

    @staticmethod
    def _wait(wire: _Group) -> None:
        if wire.closed:
            raise WireClosed("the transfer group was torn down while this rank waited in a broadcast")
        wire.cond.wait(0.05)

    def destroy(self) -> None:
        return None
