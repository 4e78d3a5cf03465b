"""Trainer side of vLLM's weight-transfer protocol (docs/design.md 3.9), one client for two transports.

Against vLLM on a GPU the tensors travel over NCCL (vLLM's own trainer helpers, imported only then);
against the embedded engine they travel over torch.distributed gloo. The HTTP sequence is the same
either way, and is the one TRL 1.16 drives (`trl/experimental/async_grpo/weight_transfer.py`,
`vllm_client.py`) against vLLM >= 0.28:

    GET /get_world_size; POST /init_weight_transfer_engine {"init_info": {master_address, master_port,
    rank_offset: 1, world_size, packed: true}} while the trainer joins as rank 0
    per sync: POST /pause?mode=keep, POST /start_weight_update, POST /update_weights {"update_info":
    {names, dtype_names, shapes}} while the tensors are broadcast, then ALWAYS POST /finish_weight_update
    (with {"weight_version": "<N>"} when the update went through) and POST /resume, even after an error.

The version is the trainer's bookkeeping, as in TRL (`AsyncGRPOTrainer.model_version`): the caller says
which version it pushes and the client tags the engine's weights with it (vLLM stores a tag only when
given one, as a string: `finish_weight_update(weight_version: str | None)` in
`vllm/entrypoints/serve/dev/rlhf/api_router.py`). Nothing is read back from the engine.

    with WeightSyncClient("http://127.0.0.1:8000", backend="gloo") as sync:
        sync.push(model.named_parameters(), version=1)
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import httpx
import torch

from engine.errors import WeightSyncError
from engine.weight_transfer import DEFAULT_PACKED_BUFFER_SIZE_BYTES, gloo_group, pack_plan

Backend = Literal["gloo", "nccl"]
PauseMode = Literal["abort", "wait", "keep"]


def routable_address() -> str:
    """This host's address as other hosts reach it, the way vLLM's `get_ip()` finds it
    (`vllm/utils/network_utils.py`, which TRL uses for the rendezvous): `VLLM_HOST_IP` if set, else the
    source address of a UDP socket "connected" to a public address (no packet is sent), IPv4 then IPv6;
    127.0.0.1 with a warning when the host has no route at all (vLLM falls back to 0.0.0.0)."""
    if os.environ.get("VLLM_HOST_IP"):
        return os.environ["VLLM_HOST_IP"]
    for family, target in ((socket.AF_INET, "8.8.8.8"), (socket.AF_INET6, "2001:4860:4860::8888")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 80))
                return s.getsockname()[0]
        except OSError:
            continue
    warnings.warn(
        "no routable address found for the weight-transfer rendezvous; using 127.0.0.1 (set "
        "VLLM_HOST_IP or weight_sync_master_address for an engine on another host)",
        stacklevel=2,
    )
    return "127.0.0.1"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rendezvous_address(engine_url: str, configured: str | None = None) -> str:
    """Where the engine joins the trainer's group: `configured`, else 127.0.0.1 for an engine on this
    host's loopback (it can always reach it), else the host's routable address (TRL's `get_ip()`)."""
    if configured:
        return configured
    host = urlsplit(engine_url).hostname or ""
    return "127.0.0.1" if _is_loopback(host) else routable_address()


class Transport(Protocol):
    """Moves tensors from the trainer (rank 0) to the engine's ranks."""

    def join(self, init_info: dict[str, Any]) -> None: ...
    def send(self, named: list[tuple[str, torch.Tensor]], update_info: dict[str, Any]) -> None: ...


class GlooTransport:
    """torch.distributed gloo broadcasts: what the embedded engine speaks (CPU tensors)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.group = None
        self.init_info: dict[str, Any] = {}

    def join(self, init_info: dict[str, Any]) -> None:
        self.init_info = init_info
        self.group = gloo_group(
            init_info["master_address"], init_info["master_port"], 0, init_info["world_size"], self.timeout_s
        )

    def send(self, named: list[tuple[str, torch.Tensor]], update_info: dict[str, Any]) -> None:
        tensors = [t.cpu() for _, t in named]
        if not self.init_info.get("packed"):
            for tensor in tensors:
                self.group.broadcast(tensor, 0).wait()
            return
        size = self.init_info.get("packed_buffer_size_bytes", DEFAULT_PACKED_BUFFER_SIZE_BYTES)
        for chunk in pack_plan(update_info["dtype_names"], update_info["shapes"], size):
            buffer = torch.cat([tensors[i].reshape(-1).view(torch.uint8) for i in chunk])
            self.group.broadcast(buffer, 0).wait()


class NcclTransport:
    """vLLM's own NCCL trainer helpers, as TRL 1.16 calls them for vLLM >= 0.28: `trainer_init` from
    `vllm/distributed/weight_transfer/nccl_common.py` and `packed_nccl_broadcast_producer` from
    `packed_tensor.py` (needs vllm and a GPU; imported only when this backend is chosen)."""

    def __init__(self) -> None:
        try:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init
            from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer
        except ImportError as exc:
            raise WeightSyncError(
                "backend 'nccl' needs vLLM >= 0.28 installed on the trainer (pip install 'harbor-rl[gpu]'); "
                "use backend 'gloo' with the embedded engine"
            ) from exc
        self._trainer_init = trainer_init
        self._producer = packed_nccl_broadcast_producer
        self.group = None
        self.init_info: dict[str, Any] = {}

    def join(self, init_info: dict[str, Any]) -> None:
        self.init_info = init_info
        self.group = self._trainer_init(init_info)

    def send(self, named: list[tuple[str, torch.Tensor]], update_info: dict[str, Any]) -> None:
        if self.init_info.get("packed"):
            sizes = {}  # both ends cut the same chunks: vLLM's defaults unless the init named others
            if "packed_buffer_size_bytes" in self.init_info:
                sizes["buffer_size_bytes"] = self.init_info["packed_buffer_size_bytes"]
            if "packed_num_buffers" in self.init_info:
                sizes["num_buffers"] = self.init_info["packed_num_buffers"]
            self._producer(
                iterator=iter(named), group=self.group, src=0, post_iter_func=lambda item: item[1], **sizes
            )
            return
        stream = torch.cuda.current_stream()
        for _, tensor in named:  # vLLM's NCCLTrainerWeightTransferEngine._broadcast, unpacked
            self.group.broadcast(tensor, src=0, stream=stream)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class WeightSyncClient:
    """Pushes a model's weights to a vLLM (nccl) or embedded (gloo) engine over its HTTP control plane."""

    def __init__(
        self,
        base_url: str,
        *,
        backend: Backend = "gloo",
        api_key: str | None = None,
        master_address: str | None = None,
        master_port: int | None = None,
        packed: bool = True,
        packed_buffer_size_bytes: int | None = None,
        pause_mode: PauseMode = "keep",
        timeout_s: float = 300.0,
    ) -> None:
        """`master_address` None: see `rendezvous_address`. `packed` as TRL sends it (True);
        `packed_buffer_size_bytes` None leaves vLLM's default (1 GiB) on both ends."""
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.backend = backend
        self.master_address = rendezvous_address(self.base_url, master_address)
        self.master_port = master_port
        self.packed = packed
        self.packed_buffer_size_bytes = packed_buffer_size_bytes
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.transport: Transport = GlooTransport(timeout_s) if backend == "gloo" else NcclTransport()
        self._joined = False
        self.version: int | None = None
        """The version this client last tagged the engine's weights with (None: none yet)."""

    def __enter__(self) -> WeightSyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the engine answers GET /health (vLLM's and the embedded engine's), as TRL waits
        `vllm_server_timeout` for its server; WeightSyncError naming the URL when it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.http.get("/health", timeout=5.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"the engine at {self.base_url} did not answer GET /health within {timeout_s:g} s "
                    "(vllm_server_timeout): is it running at vllm_server_base_url?"
                )
            time.sleep(1.0)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {path} on {self.base_url} failed: {exc}") from exc
        if response.status_code >= 400:
            raise WeightSyncError(f"{method} {path} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else {}

    def _in_background(self, path: str, body: dict[str, Any]) -> tuple[threading.Thread, list[BaseException]]:
        """POST while this thread runs the matching collective (both sides must be in it at once)."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self._call("POST", path, json=body)
            except BaseException as exc:  # handed to the caller's thread
                errors.append(exc)

        thread = threading.Thread(target=run, name=f"weight-sync{path}", daemon=True)
        thread.start()
        return thread, errors

    def _join(self, thread: threading.Thread, errors: list[BaseException], what: str) -> None:
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise WeightSyncError(f"{what} did not answer within {self.timeout_s:.0f}s")
        if errors:
            raise errors[0]

    def init_info(self, world_size: int, port: int) -> dict[str, Any]:
        """vLLM's `NCCLWeightTransferInitInfo` as TRL 1.16 fills it for vLLM >= 0.28."""
        info: dict[str, Any] = {
            "master_address": self.master_address,
            "master_port": port,
            "rank_offset": 1,
            "world_size": world_size,
            "packed": self.packed,
        }
        if self.packed_buffer_size_bytes is not None:
            info["packed_buffer_size_bytes"] = self.packed_buffer_size_bytes
        return info

    def init_transfer(self) -> None:
        """Create the transfer group: the engine joins as rank_offset=1.., the trainer as rank 0."""
        world_size = int(self._call("GET", "/get_world_size")["world_size"]) + 1
        try:
            port = self.master_port or _free_port(self.master_address)
        except OSError as exc:
            raise WeightSyncError(
                f"cannot listen for the weight-transfer group at {self.master_address} ({exc}): it must be an "
                "address of this host; set weight_sync_master_address (or VLLM_HOST_IP) to one the engine "
                f"at {self.base_url} can route to"
            ) from exc
        init_info = self.init_info(world_size, port)
        thread, errors = self._in_background("/init_weight_transfer_engine", {"init_info": init_info})
        try:
            self.transport.join(init_info)
            self._join(thread, errors, "/init_weight_transfer_engine")
        except Exception as exc:
            raise WeightSyncError(
                f"the weight-transfer group at {self.master_address}:{port} did not form: {exc}. The engine "
                f"at {self.base_url} must reach that address: set weight_sync_master_address (or "
                "VLLM_HOST_IP) to an address of this host it can route to"
            ) from exc
        self._joined = True

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Send every (name, tensor) to the engine and tag its weights `str(version)`; returns `version`.

        On any failure the engine is resumed without a new tag (vLLM keeps whatever it received; the
        embedded engine keeps its previous weights) and WeightSyncError is raised.
        """
        if not self._joined:
            self.init_transfer()
        named = [(name, tensor.detach().contiguous()) for name, tensor in named_tensors]
        update_info = {
            "names": [name for name, _ in named],
            "dtype_names": [_dtype_name(t.dtype) for _, t in named],
            "shapes": [list(t.shape) for _, t in named],
        }
        failures: list[BaseException] = []
        try:
            self._call("POST", "/pause", params={"mode": self.pause_mode})
            self._call("POST", "/start_weight_update", json={"is_checkpoint_format": True})
            thread, errors = self._in_background("/update_weights", {"update_info": update_info})
            self.transport.send(named, update_info)
            self._join(thread, errors, "/update_weights")
        except BaseException as exc:
            failures.append(exc)
        # vLLM takes the tag as a JSON string (`str | None`); an int would be refused.
        finish = {} if failures else {"json": {"weight_version": str(version)}}
        for path, kwargs in (("/finish_weight_update", finish), ("/resume", {})):
            try:
                self._call("POST", path, **kwargs)
            except BaseException as exc:
                failures.append(exc)
        if failures:
            first = failures[0]
            if isinstance(first, WeightSyncError):
                raise first
            raise WeightSyncError(f"weight sync failed: {type(first).__name__}: {first}") from first
        self.version = version
        return version
