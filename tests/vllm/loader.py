"""Load one vLLM release's own modules on a CPU-only machine, without installing vLLM.

What runs is vLLM's code, unchanged, from the unzipped wheel (`tests/vllm/wheels.py`):
`vllm/distributed/weight_transfer/{base,nccl_common,nccl_engine,packed_tensor}.py`, the RL route module
(`serve/dev/rlhf/api_router.py` in 0.28, `rl/online/api_router.py` in 0.33), the prefix-cache route
module, the server's exception handlers (`serve/exception_handling/`), `vllm/exceptions.py` and the
layerwise weight reload (`model_executor/model_loader/reload/`). A few single definitions are taken out
of files too heavy to import, by `ast`, and run as written: `Worker`'s weight-update methods
(`v1/worker/gpu_worker.py`), `AsyncLLM`'s (`v1/engine/async_llm.py`), `default_weight_loader`
(`model_executor/model_loader/weight_utils.py`), `PauseMode` (`v1/engine/__init__.py`) and the error
bodies (`ErrorInfo`, `ErrorResponse`: `entrypoints/openai/engine/protocol.py` in 0.28,
`entrypoints/serve/engine/protocol.py` in 0.33).

Stubbed, minimally, is only what those modules import and cannot run here: NCCL (`tests/vllm/wire.py`
stands in for `PyNcclCommunicator` and `StatelessProcessGroup`), CUDA streams and events (`torch.cuda`,
`torch.accelerator` in the loaded modules' view of torch), the logger, config classes, Prometheus
metrics, and attention/quantization predicates that are false for the small model the tests load.

    release = load_release("0.33.0")
    with release.active():             # its modules are `vllm.*` in sys.modules meanwhile
        release.module("vllm.distributed.weight_transfer.packed_tensor").pack_tensors(...)
"""

from __future__ import annotations

import ast
import base64
import contextlib
import dataclasses
import http
import logging
import sys
import threading
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from tests.vllm import wire
from tests.vllm.wheels import ROUTE_MODULE, release_source

# -- a CPU view of torch for the loaded modules ---------------------------------------------------


class _Stream:
    """`torch.cuda.Stream` on a machine without one: every operation is done once it is queued."""

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device = device

    def synchronize(self) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None


class _Event:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None


class _Cuda:
    Stream = _Stream

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def current_stream(device: Any = None) -> _Stream:
        return _Stream()

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None


class _Accelerator:
    @staticmethod
    def current_device_index() -> int:
        return 0

    @staticmethod
    def current_stream(device: Any = None) -> _Stream:
        return _Stream()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def device_index(index: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class Allocations:
    """Hook on the receive buffers vLLM allocates (`torch.empty` in packed_tensor.py and nccl_engine.py),
    where a GPU runs out of memory mid-receive: `fail_at` = n makes the n-th allocation (1-based) raise
    torch.OutOfMemoryError, as the CUDA caching allocator does."""

    def __init__(self) -> None:
        self.count = 0
        self.fail_at: int | None = None
        self.lock = threading.Lock()

    def check(self, size: Any) -> None:
        with self.lock:
            self.count += 1
            hit = self.fail_at is not None and self.count == self.fail_at
        if hit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size} bytes (GPU 0; injected by the test)"
            )


class CpuTorch(types.ModuleType):
    """torch as the loaded vLLM modules see it: everything is torch's own, except CUDA streams,
    events and the accelerator (no-ops on the CPU), and `empty`, which passes through `allocations`."""

    def __init__(self, allocations: Allocations) -> None:
        super().__init__("torch")
        self.cuda = _Cuda()
        self.accelerator = _Accelerator()
        self.Event = _Event
        self._allocations = allocations

    def empty(self, *size: Any, **kwargs: Any) -> torch.Tensor:
        self._allocations.check(size[0] if len(size) == 1 else size)
        return torch.empty(*size, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


# -- single definitions out of heavy files --------------------------------------------------------


def extract(path: Path, names: set[str], namespace: dict[str, Any], *, class_name: str | None = None) -> dict:
    """Run the top-level definitions `names` of `path` (or the methods `names` of its class
    `class_name`) in `namespace`, as written; annotations stay unevaluated strings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = tree.body
    if class_name is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    picked = []
    for node in body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign):
            name = next((t.id for t in node.targets if isinstance(t, ast.Name)), None)
        if name in names:
            picked.append(node)
    missing = names - {getattr(n, "name", None) or n.targets[0].id for n in picked}
    if missing:
        raise LookupError(f"{path} has no {sorted(missing)}")
    future = ast.parse("from __future__ import annotations").body
    module = ast.Module(body=[*future, *picked], type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


# -- stubs ----------------------------------------------------------------------------------------


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _package(name: str, source: Path) -> types.ModuleType:
    """A package whose `__init__.py` is not run (it imports half of vLLM), but whose submodules load
    from the unzipped files."""
    module = _module(name)
    module.__path__ = [str(source / name.replace(".", "/"))]
    return module


class _NoMetrics:
    """0.33's `rl/online/metrics.py` records Prometheus histograms (prometheus_client is not a
    dependency here); `record` is a context manager there too."""

    @contextlib.contextmanager
    def record(self, operation: str) -> Iterator[None]:
        yield


class _OpenAIBaseModel(BaseModel):
    """vLLM's `OpenAIBaseModel` less its extra-field logging: extra fields allowed."""

    model_config = ConfigDict(extra="allow")


def _b64decode(data: Any, validate: bool = False) -> bytes:
    return base64.b64decode(data, validate=validate)


@dataclasses.dataclass
class ParallelConfig:
    """The fields of `vllm.config.ParallelConfig` the weight-transfer code reads, for one GPU."""

    data_parallel_index: int = 0
    world_size: int = 1
    rank: int = 0
    world_size_across_dp: int = 1


PACKAGES = (
    "vllm", "vllm.config", "vllm.distributed", "vllm.distributed.weight_transfer",
    "vllm.distributed.device_communicators", "vllm.engine", "vllm.entrypoints", "vllm.entrypoints.openai",
    "vllm.entrypoints.openai.engine", "vllm.entrypoints.serve", "vllm.entrypoints.serve.dev",
    "vllm.entrypoints.serve.dev.rlhf", "vllm.entrypoints.serve.dev.cache", "vllm.entrypoints.serve.engine",
    "vllm.entrypoints.rl", "vllm.entrypoints.rl.online", "vllm.model_executor",
    "vllm.model_executor.layers", "vllm.model_executor.layers.quantization",
    "vllm.model_executor.model_loader", "vllm.utils", "vllm.v1", "vllm.v1.worker",
)  # fmt: skip


def _stubs(version: str, source: Path) -> dict[str, types.ModuleType]:
    mods = {name: _package(name, source) for name in PACKAGES}

    class ModelConfig:  # only named in annotations and passed through
        pass

    class VllmConfig:
        pass

    class QuantizeMethodBase:  # nothing in the test model is quantized
        pass

    class EngineClient:
        pass

    mods["vllm.config"].__dict__.update(ModelConfig=ModelConfig, VllmConfig=VllmConfig)
    mods["vllm.config.parallel"] = _module("vllm.config.parallel", ParallelConfig=ParallelConfig)
    # `@config` makes a pydantic dataclass of WeightTransferConfig; a plain dataclass has its fields.
    mods["vllm.config.utils"] = _module("vllm.config.utils", config=dataclasses.dataclass)
    mods["vllm.logger"] = _module("vllm.logger", init_logger=logging.getLogger)
    mods["vllm.engine.protocol"] = _module("vllm.engine.protocol", EngineClient=EngineClient)
    # Only for EngineDeadError (it shuts the server down); 0.33 moved it to launchers/launcher.py.
    for name in ("vllm.entrypoints.launcher", "vllm.entrypoints.launchers.launcher"):
        mods[name] = _module(name, terminate_if_errored=lambda **_: None)
    mods["vllm.entrypoints.launchers"] = _module("vllm.entrypoints.launchers")
    mods["vllm.entrypoints.rl.online.metrics"] = _module(
        "vllm.entrypoints.rl.online.metrics", weight_operation_metrics=_NoMetrics
    )
    # The test model has no attention layer (vLLM's predicate is an isinstance of AttentionLayerBase).
    mods["vllm.model_executor.layers.attention"] = _module(
        "vllm.model_executor.layers.attention", is_deferred_attention_layer=lambda layer: False
    )
    mods["vllm.model_executor.layers.quantization.base_config"] = _module(
        "vllm.model_executor.layers.quantization.base_config", QuantizeMethodBase=QuantizeMethodBase
    )
    mods["vllm.model_executor.model_loader.mtp_validation"] = _module(
        "vllm.model_executor.model_loader.mtp_validation",
        disable_mtp_completeness_check=contextlib.nullcontext,
    )
    loader_ns = {"torch": torch}
    extract(source / "vllm/model_executor/model_loader/weight_utils.py", {"default_weight_loader"}, loader_ns)
    mods["vllm.model_executor.model_loader.weight_utils"] = _module(
        "vllm.model_executor.model_loader.weight_utils",
        default_weight_loader=loader_ns["default_weight_loader"],
    )
    mods["vllm.v1.engine"] = _package("vllm.v1.engine", source)
    mods["vllm.v1.engine"].PauseMode = extract(
        source / "vllm/v1/engine/__init__.py", {"PauseMode"}, {"Literal": typing.Literal}
    )["PauseMode"]
    mods["vllm.distributed.device_communicators.pynccl"] = _module(
        "vllm.distributed.device_communicators.pynccl", PyNcclCommunicator=wire.PyNcclCommunicator
    )
    mods["vllm.distributed.device_communicators.pynccl_wrapper"] = _module(
        "vllm.distributed.device_communicators.pynccl_wrapper", NCCL_UNIQUE_ID_BYTES=128
    )
    mods["vllm.distributed.utils"] = _module(
        "vllm.distributed.utils", StatelessProcessGroup=wire.StatelessProcessGroup
    )
    mods["vllm.utils.nccl"] = _module("vllm.utils.nccl", unpinned_nccl_env=contextlib.nullcontext)
    mods["pybase64"] = _module("pybase64", b64decode=_b64decode)
    return mods


def _error_bodies(version: str, source: Path, mods: dict[str, types.ModuleType]) -> None:
    """`ErrorInfo` and `ErrorResponse` as each release defines them, where its handlers import them."""
    name = (
        "vllm.entrypoints.openai.engine.protocol"
        if version < "0.33"
        else "vllm.entrypoints.serve.engine.protocol"
    )
    path = source / (name.replace(".", "/") + ".py")
    namespace = {"OpenAIBaseModel": _OpenAIBaseModel, "__name__": name}
    extract(path, {"ErrorInfo", "ErrorResponse"}, namespace)
    namespace["ErrorInfo"].model_rebuild(_types_namespace={"ErrorInfo": namespace["ErrorInfo"]})
    namespace["ErrorResponse"].model_rebuild(_types_namespace={"ErrorInfo": namespace["ErrorInfo"]})
    module = _module(name, ErrorInfo=namespace["ErrorInfo"], ErrorResponse=namespace["ErrorResponse"])
    if version < "0.33":  # 0.28 keeps GenerationError there; 0.33 in vllm/exceptions.py
        exceptions = sys.modules["vllm.exceptions"]
        ns = {"VLLMServerError": exceptions.VLLMServerError, "HTTPStatus": http.HTTPStatus}
        module.GenerationError = extract(path, {"GenerationError"}, ns)["GenerationError"]
    mods[name] = module
    sys.modules[name] = module


# -- a release ------------------------------------------------------------------------------------


LOADED_MODULES = (
    "vllm.exceptions",
    "vllm.config.weight_transfer",
    "vllm.distributed.weight_transfer.packed_tensor",
    "vllm.distributed.weight_transfer.base",
    "vllm.distributed.weight_transfer.nccl_common",
    "vllm.distributed.weight_transfer.nccl_engine",
    "vllm.v1.engine.exceptions",
    "vllm.model_executor.model_loader.reload",
    "vllm.entrypoints.serve.exception_handling.register",
    "vllm.entrypoints.serve.dev.cache.api_router",
)
"""vLLM's own modules, imported from the wheel's files in this order (the route module comes last)."""
CPU_TORCH_MODULES = (
    "vllm.distributed.weight_transfer.packed_tensor",
    "vllm.distributed.weight_transfer.base",
    "vllm.distributed.weight_transfer.nccl_common",
    "vllm.distributed.weight_transfer.nccl_engine",
)
"""The modules that touch CUDA streams, events or the accelerator: they see `CpuTorch`."""


class Release:
    """One vLLM release's modules, loaded once per process, put into `sys.modules` on demand (its
    modules import each other lazily, by name, at call time)."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.source = release_source(version)
        self.allocations = Allocations()
        self.modules: dict[str, types.ModuleType] = {}
        self._lock = threading.RLock()
        with self._swapped_in(_stubs(version, self.source)):
            __import__("vllm.exceptions")
            _error_bodies(version, self.source, self.modules)  # before the handlers import them
            for name in LOADED_MODULES:
                __import__(name)
            self.route_module_name = ROUTE_MODULE[version].removesuffix(".py").replace("/", ".")
            __import__(self.route_module_name)
            self.modules.update({k: v for k, v in sys.modules.items() if _is_ours(k)})
        cpu_torch = CpuTorch(self.allocations)
        for name in CPU_TORCH_MODULES:
            self.modules[name].torch = cpu_torch

    def module(self, name: str) -> types.ModuleType:
        return self.modules[name]

    @property
    def routes(self) -> types.ModuleType:
        return self.modules[self.route_module_name]

    def extract(self, relative: str, names: set[str], namespace: dict[str, Any], **kwargs: Any) -> dict:
        return extract(self.source / relative, names, namespace, **kwargs)

    @contextlib.contextmanager
    def _swapped_in(self, modules: dict[str, types.ModuleType]) -> Iterator[None]:
        saved = {k: v for k, v in sys.modules.items() if _is_ours(k)}
        for name in saved:
            del sys.modules[name]
        sys.modules.update(modules)
        self.modules.update(modules)
        try:
            yield
        finally:
            for name in [k for k in sys.modules if _is_ours(k)]:
                del sys.modules[name]
            sys.modules.update(saved)

    @contextlib.contextmanager
    def active(self) -> Iterator[Release]:
        """This release's modules are `vllm.*` while the block runs. `Tensor.record_stream` becomes a
        no-op meanwhile: it has no CPU kernel (it raises on every CPU tensor), so nothing that runs on
        a CPU can rely on it, and vLLM 0.33's packed consumer calls it on every receive buffer."""
        with self._lock, self._swapped_in(self.modules):
            original = torch.Tensor.record_stream
            torch.Tensor.record_stream = lambda tensor, stream: None
            try:
                yield self
            finally:
                torch.Tensor.record_stream = original


def _is_ours(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.") or name == "pybase64"


_RELEASES: dict[str, Release] = {}


def load_release(version: str) -> Release:
    if version not in _RELEASES:
        _RELEASES[version] = Release(version)
    return _RELEASES[version]
