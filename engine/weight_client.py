"""Trainer side of vLLM's weight-transfer protocol (docs/design.md 3.9), one client for two transports.

Against vLLM on a GPU the tensors travel over NCCL (vLLM's own trainer helpers, imported only then);
against the embedded engine they travel over torch.distributed gloo. The HTTP sequence is the same
either way, and is the one TRL 1.16 drives (`trl/experimental/async_grpo/weight_transfer.py`,
`vllm_client.py`) against vLLM >= 0.28:

    once:     GET /get_world_size, GET /server_info (the engine's dtype and transfer backend), POST
              /init_weight_transfer_engine {"init_info": {..., packed: true}} while the trainer joins
    per push: POST /pause?mode=keep, POST /start_weight_update, POST /update_weights {"update_info":
              {names, dtype_names, shapes}} while the tensors are sent, POST /finish_weight_update
              {"weight_version": "<N>"}, POST /resume

As in TRL, the tensors are sent on a worker thread and the HTTP call that drives the engine stays on the
caller's: NCCL has no timeout, so the engine's HTTP answer (or its absence within the step's time
bound) is what ends a failed push. Every call opens a fresh connection: vLLM answers a failure with a
500 and closes the connection, and a pooled client lost the next call in about one push in five.

What a failed push leaves (docs/design.md 3.9, "Failure semantics"; docs/reliability.md):
- before `/start_weight_update` (the group, the engine's dtype, `/pause`): the engine's weights are
  untouched; the client resumes it and raises WeightSyncError. The run stops; the engine serves on.
- from `/start_weight_update` to `/finish_weight_update`: the engine may hold part of the new weights
  (vLLM loads them layer by layer as they arrive and refuses /finish_weight_update once a load failed,
  `vllm/v1/worker/gpu_worker.py`). The client does not resume it: it raises WeightSyncError saying the
  engine is left paused, and the run stops. Nothing is sampled from half-loaded weights.
- `/resume` is retried; if it still fails the engine holds the complete new weights, paused.

The version is the trainer's bookkeeping, as in TRL (`AsyncGRPOTrainer.model_version`): the caller says
which version it pushes and the client tags the engine's weights with it (vLLM stores a tag only when
given one, as a string). Nothing is read back except to check a finish whose answer was lost.

    with WeightSyncClient("http://127.0.0.1:8000", backend="gloo") as sync:
        sync.push(model.named_parameters(), version=1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import queue
import socket
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlencode, urlsplit

import httpcore
import torch

from engine.errors import WeightSyncError
from harbor_rl_vllm.wire import DEFAULT_PACKED_BUFFER_SIZE_BYTES, gloo_group, pack_plan

log = logging.getLogger(__name__)

Backend = Literal["gloo", "nccl"]
BackendChoice = Literal["auto", "gloo", "nccl"]
"""`auto`: the backend the engine says it receives over (`/server_info`'s `weight_transfer_config`)."""
PauseMode = Literal["abort", "wait", "keep"]

CONTROL_TIMEOUT_S = 60.0
"""Bound of the steps that do not scale with the model: world size, server info, pause (keep or abort),
start, resume, weight info."""
TRANSFER_TIMEOUT_S = 1800.0
"""Bound of the steps that do: the group's rendezvous, the transfer, and the finish that processes the
layers it loaded (TRL's `weight_sync_timeout`)."""
RETRIES = 3
"""Attempts at /pause and /resume (both idempotent in vLLM), each on a fresh connection."""


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


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- what is sent -----------------------------------------------------------------------------------


@runtime_checkable
class WeightStream(Protocol):
    """Weights whose names, dtypes and shapes are known before any tensor exists (FSDP2: a DTensor's
    shape is the full one, and `full_tensor()` gathers it only when iterated). Iteration yields
    exactly `metadata()`'s names, in that order, one full tensor at a time."""

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]: ...
    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


class TensorList:
    """A WeightStream over tensors that already exist."""

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.named = [(name, tensor.detach()) for name, tensor in named]

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(name, t.dtype, tuple(t.shape)) for name, t in self.named]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The update as the engine is told it (`update_info`) and as the trainer holds it."""

    names: list[str]
    source_shapes: list[tuple[int, ...]]
    wire_dtypes: list[torch.dtype]
    shapes: list[list[int]]

    @classmethod
    def build(
        cls, metadata: list[tuple[str, torch.dtype, tuple[int, ...]]], engine_dtype: torch.dtype | None
    ) -> Plan:
        wire = [
            engine_dtype if engine_dtype is not None and dtype.is_floating_point else dtype
            for _, dtype, _ in metadata
        ]
        # A 0-dim tensor goes as shape [1]: vLLM 0.28-0.31's packer cannot view one as bytes nor
        # unpack one (`view(torch.uint8)` and `view(*shape)` in packed_tensor.py; fixed in 0.32), and
        # vLLM's default_weight_loader loads a one-element tensor into a one-element parameter of any
        # shape (`param.data.copy_(loaded_weight.view(param.shape))`, model_loader/weight_utils.py).
        shapes = [list(shape) or [1] for _, _, shape in metadata]
        return cls([n for n, _, _ in metadata], [tuple(s) for _, _, s in metadata], wire, shapes)

    @property
    def update_info(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "dtype_names": [dtype_name(d) for d in self.wire_dtypes],
            "shapes": self.shapes,
        }


class Transport(Protocol):
    """Moves tensors from the trainer (rank 0) to the engine's ranks."""

    device: torch.device
    """Where the tensors must be for `send` (the communicator's device)."""

    def join(self, init_info: dict[str, Any]) -> None: ...
    def send(self, items: Iterator[tuple[str, torch.Tensor]], plan: Plan) -> None: ...


class GlooTransport:
    """torch.distributed gloo broadcasts: what the embedded engine speaks (CPU tensors)."""

    device = torch.device("cpu")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.group = None
        self.init_info: dict[str, Any] = {}

    def join(self, init_info: dict[str, Any]) -> None:
        self.init_info = init_info
        self.group = gloo_group(
            init_info["master_address"], init_info["master_port"], 0, init_info["world_size"], self.timeout_s
        )

    def send(self, items: Iterator[tuple[str, torch.Tensor]], plan: Plan) -> None:
        if not self.init_info.get("packed"):
            for _, tensor in items:
                self.group.broadcast(tensor, 0).wait()
            return
        size = self.init_info.get("packed_buffer_size_bytes", DEFAULT_PACKED_BUFFER_SIZE_BYTES)
        info = plan.update_info
        for chunk in pack_plan(info["dtype_names"], info["shapes"], size):
            parts = [next(items)[1].reshape(-1).view(torch.uint8) for _ in chunk]
            self.group.broadcast(torch.cat(parts), 0).wait()


def _transport(backend: Backend, timeout_s: float) -> Transport:
    return GlooTransport(timeout_s) if backend == "gloo" else NcclTransport()


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

    @property
    def device(self) -> torch.device:
        # vLLM's PyNcclCommunicator asserts every tensor is on its device (pynccl.py `broadcast`): a
        # trainer on the CPU, or FSDP2's gathered CPU copies, must be moved there first.
        return self.group.device

    def join(self, init_info: dict[str, Any]) -> None:
        self.init_info = init_info
        self.group = self._trainer_init(init_info)

    def send(self, items: Iterator[tuple[str, torch.Tensor]], plan: Plan) -> None:
        if self.init_info.get("packed"):
            sizes = {}  # both ends cut the same chunks: vLLM's defaults unless the init named others
            if "packed_buffer_size_bytes" in self.init_info:
                sizes["buffer_size_bytes"] = self.init_info["packed_buffer_size_bytes"]
            if "packed_num_buffers" in self.init_info:
                sizes["num_buffers"] = self.init_info["packed_num_buffers"]
            self._producer(
                iterator=items, group=self.group, src=0, post_iter_func=lambda item: item[1], **sizes
            )
            return
        stream = torch.cuda.current_stream()
        for _, tensor in items:  # vLLM's NCCLTrainerWeightTransferEngine._broadcast, unpacked
            self.group.broadcast(tensor, src=0, stream=stream)
        stream.synchronize()


# -- threads --------------------------------------------------------------------------------------


def _use_device(device: int | None) -> None:
    """A new thread's current CUDA device is 0: take the caller's (FSDP gathers, NCCL streams)."""
    if device is not None:
        torch.cuda.set_device(device)


class _Feeder:
    """Iterates the weights on its own thread, one full tensor at a time, and hands each over in its
    wire form (on the transport's device, in the wire dtype, 0-dim as [1]), checked against the plan
    as vLLM's `NCCLTrainerWeightTransferEngine._checked_iter` checks a source: a disagreement would cut
    the stream differently on the two ends. `abandon()` keeps it iterating without handing anything
    over, so the other ranks' FSDP gathers still complete after a failed push."""

    _END = object()

    def __init__(self, weights: Iterable[tuple[str, torch.Tensor]], plan: Plan, device: torch.device,
                 cuda_device: int | None) -> None:  # fmt: skip
        self.plan, self.device, self.cuda_device = plan, device, cuda_device
        self.handoff: queue.Queue = queue.Queue(maxsize=1)
        self.abandoned = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(iter(weights),), name="weight-sync-feed", daemon=True
        )
        self.thread.start()

    def _wire_form(self, index: int, name: str, tensor: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        if index >= len(plan.names):
            raise ValueError(
                f"the weights yielded more tensors than the {len(plan.names)} declared; first extra {name!r}"
            )
        if name != plan.names[index] or tuple(tensor.shape) != plan.source_shapes[index]:
            raise ValueError(
                f"tensor {index} is {name!r} {tuple(tensor.shape)}, but {plan.names[index]!r} "
                f"{plan.source_shapes[index]} was declared: the weights' metadata and iteration disagree"
            )
        wire = (
            tensor.detach().to(device=self.device, dtype=plan.wire_dtypes[index]).reshape(plan.shapes[index])
        )
        wire = wire.contiguous()
        if wire.device.type == "cuda":  # ready before another thread's stream reads it
            torch.cuda.current_stream(wire.device).synchronize()
        return wire

    def _run(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        try:
            _use_device(self.cuda_device)
            count = 0
            for index, (name, tensor) in enumerate(weights):
                count = index + 1
                if self.abandoned.is_set():
                    continue
                self._hand_over((name, self._wire_form(index, name, tensor)))
            if count != len(self.plan.names) and not self.abandoned.is_set():
                raise ValueError(
                    f"the weights yielded {count} tensors but {len(self.plan.names)} were declared"
                )
            self._hand_over(self._END)
        except BaseException as exc:  # handed to the sender, which fails the push with it
            self._hand_over(exc)

    def _hand_over(self, item: Any) -> None:
        while not self.abandoned.is_set():
            try:
                self.handoff.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        while True:
            item = self.handoff.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def abandon(self) -> None:
        self.abandoned.set()


class _Sender:
    """Runs the transport's send on its own thread (NCCL cannot be interrupted; a send whose receiver
    stopped blocks forever, and the thread is abandoned to the process)."""

    def __init__(
        self, transport: Transport, feeder: _Feeder, plan: Plan, on_error: Any, cuda_device: int | None
    ) -> None:
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._on_error = on_error

        def run() -> None:
            try:
                _use_device(cuda_device)
                transport.send(feeder.items(), plan)
            except BaseException as exc:
                self.error = exc
                self._on_error()
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, name="weight-sync-send", daemon=True)
        self.thread.start()


# -- HTTP -----------------------------------------------------------------------------------------


class _Connections(httpcore.SyncBackend):
    """httpcore's network backend that remembers its sockets, so another thread can end a call that
    waits for an answer (closing a socket does not wake a blocked read; shutting it down does)."""

    def __init__(self) -> None:
        self.streams: list[Any] = []

    def connect_tcp(self, *args: Any, **kwargs: Any) -> Any:
        stream = super().connect_tcp(*args, **kwargs)
        self.streams.append(stream)
        return stream

    def abort(self) -> None:
        for stream in self.streams:
            with contextlib.suppress(OSError):  # already closed
                stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)


class _Failure(Exception):
    """One step failed: vLLM refused it (`status`, its message) or it got no answer (`status` None)."""

    def __init__(self, step: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.step, self.message, self.status = step, message, status

    def describe(self) -> str:
        what = f"answered {self.status}: {self.message}" if self.status is not None else self.message
        return f"{self.step} {what}"


def _engine_message(status: int, body: bytes) -> str:
    """vLLM's own words: ErrorResponse's `error.message`, /pause's `{"error": str}`, or the text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:500] or f"HTTP {status}"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])[:1000]
    if isinstance(error, str):
        return error[:1000]
    return json.dumps(data)[:500]


# -- the client -----------------------------------------------------------------------------------


class WeightSyncClient:
    """Pushes a model's weights to a vLLM (nccl) or embedded (gloo) engine over its HTTP control plane."""

    def __init__(
        self,
        base_url: str,
        *,
        backend: BackendChoice = "auto",
        api_key: str | None = None,
        master_address: str | None = None,
        master_port: int | None = None,
        packed: bool = True,
        packed_buffer_size_bytes: int | None = None,
        pause_mode: PauseMode = "keep",
        timeout_s: float = TRANSFER_TIMEOUT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        expected_dtype: torch.dtype | None = None,
        retry_delay_s: float = 1.0,
    ) -> None:
        """`master_address` None: see `rendezvous_address`. `packed` as TRL sends it (True);
        `packed_buffer_size_bytes` None leaves vLLM's default (1 GiB) on both ends. `timeout_s` bounds
        the steps that scale with the model, `control_timeout_s` the others. `expected_dtype` is what
        the trainer's forward passes compute in (bf16 under autocast): an engine serving another dtype
        gets a warning (the gap biases the importance ratio), and the weights go in the engine's."""
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.backend = backend
        self.master_address = rendezvous_address(self.base_url, master_address)
        self.master_port = master_port
        self.packed = packed
        self.packed_buffer_size_bytes = packed_buffer_size_bytes
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        self.control_timeout_s = control_timeout_s
        self.expected_dtype = expected_dtype
        self.retry_delay_s = retry_delay_s
        self.headers = [(b"Authorization", f"Bearer {api_key}".encode())] if api_key else []
        self.transport: Transport | None = None if backend == "auto" else _transport(backend, timeout_s)
        """None until `init_transfer` learns the engine's backend (`auto`)."""
        self.engine_dtype: torch.dtype | None = None
        """The dtype the engine serves in (`/server_info`), None when it did not say."""
        self._joined = False
        self._calls: list[_Connections] = []
        self._calls_lock = threading.Lock()
        self.version: int | None = None
        """The version this client last tagged the engine's weights with (None: none yet)."""

    def __enter__(self) -> WeightSyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        return None  # every call opened and closed its own connection

    # -- HTTP, one fresh connection per call ---------------------------------------------------------

    def _request(self, method: str, path: str, step: str, timeout_s: float, *, params: dict[str, Any] | None = None,
                 body: Any = None) -> dict[str, Any]:  # fmt: skip
        url = self.base_url + path + (f"?{urlencode(params)}" if params else "")
        headers = list(self.headers)
        content = b""
        if body is not None:
            content = json.dumps(body).encode()
            headers.append((b"Content-Type", b"application/json"))
        connections = _Connections()
        with self._calls_lock:
            self._calls.append(connections)
        timeouts = {"connect": min(10.0, timeout_s), "read": timeout_s, "write": timeout_s, "pool": timeout_s}
        try:
            with httpcore.ConnectionPool(network_backend=connections, max_keepalive_connections=0) as pool:
                response = pool.request(
                    method, url, headers=headers, content=content, extensions={"timeout": timeouts}
                )
        except httpcore.TimeoutException as exc:
            raise _Failure(step, f"got no answer within {timeout_s:g} s ({type(exc).__name__})") from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, OSError) as exc:
            raise _Failure(step, f"got no answer: {type(exc).__name__}: {exc}") from exc
        finally:
            with self._calls_lock:
                self._calls.remove(connections)
        if response.status >= 400:
            raise _Failure(step, _engine_message(response.status, response.content), response.status)
        try:
            return json.loads(response.content) if response.content.strip() else {}
        except ValueError:
            return {}

    def _abort_calls(self) -> None:
        """End every call waiting for an answer (the send failed: the engine waits for bytes that will
        never come and would answer only at the step's time bound)."""
        with self._calls_lock:
            calls = list(self._calls)
        for connections in calls:
            connections.abort()

    def _retried(self, method: str, path: str, step: str, timeout_s: float, **kwargs: Any) -> dict[str, Any]:
        for attempt in range(1, RETRIES + 1):
            try:
                return self._request(method, path, step, timeout_s, **kwargs)
            except _Failure as exc:
                if attempt == RETRIES:
                    raise
                log.warning("%s (attempt %d of %d); retrying", exc.describe(), attempt, RETRIES)
                time.sleep(self.retry_delay_s)
        raise AssertionError("unreachable")

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the engine answers GET /health (vLLM's and the embedded engine's), as TRL waits
        `vllm_server_timeout` for its server; WeightSyncError naming the URL when it never does."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._request("GET", "/health", "GET /health", 5.0)
                return
            except _Failure:
                pass
            if time.monotonic() > deadline:
                raise WeightSyncError(
                    f"the engine at {self.base_url} did not answer GET /health within {timeout_s:g} s "
                    "(vllm_server_timeout): is it running at vllm_server_base_url?"
                )
            time.sleep(1.0)

    # -- once: the group and the engine's dtype ----------------------------------------------------

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

    def read_server_info(self) -> dict[str, Any] | None:
        """vLLM's resolved config from `/server_info?config_format=json` (`vllm_config`), as TRL's
        `VLLMClient.get_dtype` reads it; None, with a warning, when the engine does not give it."""
        try:
            info = self._request("GET", "/server_info", "GET /server_info", self.control_timeout_s,
                                 params={"config_format": "json"})  # fmt: skip
            config = info["vllm_config"]
            if not isinstance(config, dict):
                raise TypeError(f"vllm_config is {type(config).__name__}, not an object")
            return config
        except (_Failure, KeyError, TypeError) as exc:
            warnings.warn(
                f"could not read the engine's config from {self.base_url}/server_info ({exc}); the weights "
                "go in the trainer's dtypes",
                stacklevel=3,
            )
            return None

    def _resolve_backend(self, config: dict[str, Any] | None) -> None:
        """vLLM's `--weight-transfer-config` fills `weight_transfer_config` (`vllm/config/weight_transfer.py`:
        nccl, its default and, in 0.28-0.33, only backend); the embedded engine reports gloo."""
        offered = (config or {}).get("weight_transfer_config") or {}
        engine_backend = offered.get("backend", "nccl") if isinstance(offered, dict) else "nccl"
        if self.backend == "auto":
            if engine_backend not in ("gloo", "nccl"):
                raise WeightSyncError(
                    f"the engine at {self.base_url} receives weights over {engine_backend!r}; this client "
                    "sends over nccl or gloo"
                )
            self.backend = engine_backend
            self.transport = _transport(engine_backend, self.timeout_s)
        elif offered and engine_backend != self.backend:
            raise WeightSyncError(
                f"the engine at {self.base_url} receives weights over {engine_backend} (its "
                f"weight_transfer_config) but weight_sync_backend is {self.backend}: set weight_sync_backend "
                f"to auto or {engine_backend}"
            )

    def _check_dtype(self, config: dict[str, Any] | None) -> None:
        name = str(((config or {}).get("model_config") or {}).get("dtype", "")).removeprefix("torch.")
        dtype = getattr(torch, name, None) if name else None
        self.engine_dtype = dtype if isinstance(dtype, torch.dtype) else None
        expected, served = self.expected_dtype, self.engine_dtype
        if expected is not None and served is not None and expected != served:
            message = (
                f"the engine at {self.base_url} serves {dtype_name(served)} but the trainer computes in "
                f"{dtype_name(expected)}: the precision gap biases the importance ratio. Start vLLM with "
                f"--dtype {dtype_name(expected)} (harbor jobs does), or train with bf16 set to match. The "
                f"weights are sent in {dtype_name(served)}."
            )
            log.warning("%s", message)
            warnings.warn(message, stacklevel=3)

    def init_transfer(self) -> None:
        """Create the transfer group: the engine joins as rank_offset=1.., the trainer as rank 0 (on a
        worker thread, while this thread makes the HTTP call, as TRL does)."""
        try:
            world_size = int(self._request("GET", "/get_world_size", "GET /get_world_size",
                                           self.control_timeout_s)["world_size"]) + 1  # fmt: skip
        except _Failure as exc:
            raise WeightSyncError(
                f"cannot set up weight sync with {self.base_url}: {exc.describe()}"
            ) from exc
        config = self.read_server_info()
        self._resolve_backend(config)
        self._check_dtype(config)
        try:
            port = self.master_port or _free_port(self.master_address)
        except OSError as exc:
            raise WeightSyncError(
                f"cannot listen for the weight-transfer group at {self.master_address} ({exc}): it must be an "
                "address of this host; set weight_sync_master_address (or VLLM_HOST_IP) to one the engine "
                f"at {self.base_url} can route to"
            ) from exc
        init_info = self.init_info(world_size, port)
        joined: list[BaseException] = []
        done = threading.Event()
        cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None

        def join() -> None:
            try:
                _use_device(cuda_device)
                self.transport.join(init_info)
            except BaseException as exc:
                joined.append(exc)
                self._abort_calls()
            finally:
                done.set()

        threading.Thread(target=join, name="weight-sync-join", daemon=True).start()
        try:
            self._request("POST", "/init_weight_transfer_engine", "POST /init_weight_transfer_engine",
                          self.timeout_s, body={"init_info": init_info})  # fmt: skip
            if not done.wait(self.control_timeout_s):
                raise _Failure("joining the group", f"did not complete within {self.control_timeout_s:g} s")
            if joined:
                raise joined[0]
        except BaseException as exc:
            cause = joined[0] if joined else exc
            detail = cause.describe() if isinstance(cause, _Failure) else f"{type(cause).__name__}: {cause}"
            raise WeightSyncError(
                f"the weight-transfer group at {self.master_address}:{port} did not form: {detail}. The engine "
                f"at {self.base_url} must reach that address: set weight_sync_master_address (or "
                "VLLM_HOST_IP) to an address of this host it can route to"
            ) from exc
        self._joined = True

    # -- each push -----------------------------------------------------------------------------------

    def push(self, weights: WeightStream | Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """Send the weights to the engine and tag them `str(version)`; returns `version`.

        `weights` is a WeightStream (FSDP2's gathered one tensor at a time) or (name, tensor) pairs.
        A failure raises WeightSyncError naming the step and the engine's own message; see the module
        docstring for the state it leaves the engine in (`error.paused`)."""
        if not self._joined:
            self.init_transfer()
        stream = weights if isinstance(weights, WeightStream) else TensorList(weights)
        plan = Plan.build(stream.metadata(), self.engine_dtype)
        self._pause(version)
        try:
            self._request("POST", "/start_weight_update", "POST /start_weight_update", self.control_timeout_s,
                          body={"is_checkpoint_format": True})  # fmt: skip
            self._update(stream, plan)
            self._finish(version)
        except _Failure as exc:
            raise WeightSyncError(
                f"weight push of version {version} to {self.base_url} failed: {exc.describe()}. The engine is "
                "left PAUSED (it may hold part of the new weights) and the run stops; restart the run "
                "(--resume pushes the checkpoint's weights first) or restart the engine",
                step=exc.step, paused=True,
            ) from exc  # fmt: skip
        self._resume(version)
        self.version = version
        return version

    def _pause(self, version: int) -> None:
        """Nothing is loaded yet: if the engine will not pause, it is resumed and serves on."""
        timeout = (
            self.timeout_s if self.pause_mode == "wait" else self.control_timeout_s
        )  # wait drains requests
        try:
            self._retried("POST", "/pause", "POST /pause", timeout, params={"mode": self.pause_mode})
        except _Failure as exc:
            try:
                self._retried("POST", "/resume", "POST /resume", self.control_timeout_s)
                state, paused = "it was resumed and serves its previous weights", False
            except _Failure as again:
                state, paused = f"resuming it failed too ({again.describe()}): it may be left paused", True
            raise WeightSyncError(
                f"weight push of version {version} to {self.base_url} failed before any tensor was sent: "
                f"{exc.describe()}; {state}",
                step=exc.step, paused=paused,
            ) from exc  # fmt: skip

    def _update(self, stream: WeightStream, plan: Plan) -> None:
        """POST /update_weights here while the tensors go out on worker threads."""
        cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None
        feeder = _Feeder(stream, plan, self.transport.device, cuda_device)
        sender = _Sender(self.transport, feeder, plan, self._abort_calls, cuda_device)
        step = "POST /update_weights"
        try:
            self._request(
                "POST", "/update_weights", step, self.timeout_s, body={"update_info": plan.update_info}
            )
        except _Failure as exc:
            feeder.abandon()
            if sender.error is not None:  # the trainer failed to send: the engine waits for the rest
                raise _Failure(step, f"was cut short because sending the tensors failed on the trainer: "
                                     f"{type(sender.error).__name__}: {sender.error} (the engine still waits "
                                     "for them: restart it)") from sender.error  # fmt: skip
            if exc.status is not None or not sender.done.wait(self.control_timeout_s) or sender.error:
                raise  # vLLM's own refusal, or no answer and the tensors never all arrived
            # No answer, but every tensor arrived: vLLM finishes only an update whose load completed.
            log.warning("%s, but every tensor was received; finishing decides", exc.describe())
            return
        if not sender.done.wait(self.control_timeout_s):
            feeder.abandon()
            raise _Failure(
                step, f"answered, but the send did not complete within {self.control_timeout_s:g} s"
            )
        if sender.error is not None:
            raise _Failure(step, f"answered, but the send failed: {sender.error}")

    def _finish(self, version: int) -> None:
        step = "POST /finish_weight_update"
        try:
            self._request("POST", "/finish_weight_update", step, self.timeout_s,
                          body={"weight_version": str(version)})  # fmt: skip
        except _Failure as exc:
            if exc.status is None and self._tag() == str(version):
                return  # the answer was lost, but vLLM tags only weights whose finish went through
            raise

    def _tag(self) -> str | None:
        try:
            return self._request("GET", "/weight_info", "GET /weight_info", self.control_timeout_s).get(
                "weight_version"
            )
        except _Failure:
            return None

    def _resume(self, version: int) -> None:
        try:
            self._retried("POST", "/resume", "POST /resume", self.control_timeout_s)
        except _Failure as exc:
            raise WeightSyncError(
                f"the engine at {self.base_url} holds weight version {version} but did not resume: "
                f"{exc.describe()}. It is left PAUSED and the run stops; POST /resume to it by hand",
                step=exc.step, paused=True,
            ) from exc  # fmt: skip
