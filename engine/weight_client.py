"""Trainer side of vLLM's weight-transfer protocol (docs/design.md 3.9), one client for two transports.

Against vLLM on a GPU the tensors travel over NCCL (vLLM's own `NCCLWeightTransferEngine` helpers,
imported only then); against the embedded engine they travel over torch.distributed gloo. The HTTP
sequence is the same either way:

    GET /get_world_size; POST /init_weight_transfer_engine (trainer joins as rank 0 meanwhile)
    per sync: POST /pause?mode=keep, POST /start_weight_update, POST /update_weights while the
    tensors are broadcast, then ALWAYS POST /finish_weight_update and POST /resume, even after an error.

    with WeightSyncClient("http://127.0.0.1:8000", backend="gloo") as sync:
        version = sync.push(model.named_parameters())
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from typing import Any, Literal, Protocol

import httpx
import torch

from engine.errors import WeightSyncError
from engine.weight_transfer import DEFAULT_PACKED_BUFFER_SIZE_BYTES, gloo_group, pack_plan

Backend = Literal["gloo", "nccl"]
PauseMode = Literal["abort", "wait", "keep"]


class Transport(Protocol):
    """Moves tensors from the trainer (rank 0) to the engine's ranks."""

    def join(self, master_address: str, master_port: int, world_size: int) -> None: ...
    def send(self, tensors: list[torch.Tensor], update_info: dict[str, Any]) -> None: ...


class GlooTransport:
    """torch.distributed gloo broadcasts: what the embedded engine speaks (CPU tensors)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.group = None

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        self.group = gloo_group(master_address, master_port, 0, world_size, self.timeout_s)

    def send(self, tensors: list[torch.Tensor], update_info: dict[str, Any]) -> None:
        if not update_info.get("packed"):
            for tensor in tensors:
                self.group.broadcast(tensor, 0).wait()
            return
        plan = pack_plan(
            update_info["dtype_names"], update_info["shapes"], update_info["packed_buffer_size_bytes"]
        )
        for chunk in plan:
            buffer = torch.cat([tensors[i].reshape(-1).view(torch.uint8) for i in chunk])
            self.group.broadcast(buffer, 0).wait()


class NcclTransport:
    """vLLM's own NCCL helpers (needs vllm and a GPU; imported only when this backend is chosen)."""

    def __init__(self) -> None:
        try:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
        except ImportError as exc:
            raise WeightSyncError(
                "backend 'nccl' needs vLLM installed on the trainer (pip install 'harbor-rl[gpu]'); "
                "use backend 'gloo' with the embedded engine"
            ) from exc
        self.engine = NCCLWeightTransferEngine
        self.group = None

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        self.group = self.engine.trainer_init(
            {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        )

    def send(self, tensors: list[torch.Tensor], update_info: dict[str, Any]) -> None:
        named = zip(update_info["names"], tensors, strict=True)
        args: dict[str, Any] = {"group": self.group, "packed": bool(update_info.get("packed"))}
        if "packed_buffer_size_bytes" in update_info:  # both ends must cut the same buffers
            args["packed_buffer_size_bytes"] = update_info["packed_buffer_size_bytes"]
        self.engine.trainer_send_weights(named, args)


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
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        packed: bool = False,
        packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        pause_mode: PauseMode = "keep",
        timeout_s: float = 300.0,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.backend = backend
        self.master_address = master_address
        self.master_port = master_port
        self.packed = packed
        self.packed_buffer_size_bytes = packed_buffer_size_bytes
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.transport: Transport = GlooTransport(timeout_s) if backend == "gloo" else NcclTransport()
        self._joined = False

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

    def init_transfer(self) -> None:
        """Create the transfer group: the engine joins as rank_offset=1.., the trainer as rank 0."""
        world_size = int(self._call("GET", "/get_world_size")["world_size"]) + 1
        port = self.master_port or _free_port(self.master_address)
        init_info = {
            "master_address": self.master_address,
            "master_port": port,
            "rank_offset": 1,
            "world_size": world_size,
        }
        thread, errors = self._in_background("/init_weight_transfer_engine", {"init_info": init_info})
        try:
            self.transport.join(self.master_address, port, world_size)
        except Exception as exc:
            raise WeightSyncError(
                f"joining the weight-transfer group at {self.master_address}:{port} failed: {exc}"
            ) from exc
        self._join(thread, errors, "/init_weight_transfer_engine")
        self._joined = True

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Send every (name, tensor) to the engine and return the engine's new weight version.

        On any failure the engine keeps its previous weights and is resumed; WeightSyncError is raised.
        """
        if not self._joined:
            self.init_transfer()
        names, tensors = [], []
        for name, tensor in named_tensors:
            tensor = tensor.detach().contiguous()
            names.append(name)
            tensors.append(tensor.cpu() if self.backend == "gloo" else tensor)
        update_info: dict[str, Any] = {
            "names": names,
            "dtype_names": [_dtype_name(t.dtype) for t in tensors],
            "shapes": [list(t.shape) for t in tensors],
            "packed": self.packed,
        }
        if self.packed:
            update_info["packed_buffer_size_bytes"] = self.packed_buffer_size_bytes
        failures: list[BaseException] = []
        try:
            self._call("POST", "/pause", params={"mode": self.pause_mode})
            self._call("POST", "/start_weight_update", json={"is_checkpoint_format": True})
            thread, errors = self._in_background("/update_weights", {"update_info": update_info})
            self.transport.send(tensors, update_info)
            self._join(thread, errors, "/update_weights")
        except BaseException as exc:
            failures.append(exc)
        finally:
            for path in ("/finish_weight_update", "/resume"):
                try:
                    self._call("POST", path)
                except BaseException as exc:
                    failures.append(exc)
        if failures:
            first = failures[0]
            if isinstance(first, WeightSyncError):
                raise first
            raise WeightSyncError(f"weight sync failed: {type(first).__name__}: {first}") from first
        return int(self._call("GET", "/weight_info")["weight_version"])
