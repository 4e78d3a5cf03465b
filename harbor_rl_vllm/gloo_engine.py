"""vLLM's worker end of a gloo weight push: a `WeightTransferEngine` (`vllm/distributed/weight_transfer/
base.py`) that joins the trainer's gloo group and loads what it receives through vLLM's layerwise reload,
as the NCCL engine does (`nccl_engine.py`), so the push drives vLLM's real routes, pause and resume.

The wire is the NCCL backend's: `init_info` has its fields (`NCCLWeightTransferInitInfo`,
`nccl_common.py`; the torch-free unique-id rendezvous is NCCL's own and not offered) and `update_info` is
`NCCLWeightTransferUpdateInfo` (names, dtype_names, shapes); packed chunks are cut alike (wire.py).

One fix for vLLM's CPU build: with tied embeddings the LM head shares the embedding's weight, which the
checkpoint (and so the push) names once, as `embed_tokens`. The layerwise reload reports the head as
"ParallelLMHead: Failed to load weights" and puts its tensor back, whose storage the embedding's new
values were copied into; but on the CPU, `UnquantizedEmbeddingMethod.process_weights_after_loading`
(`vocab_parallel_embedding.py`) had prepacked that weight into a GEMM handle of its own
(`dispatch_cpu_unquantized_gemm`, `model_executor/layers/utils.py`), which nothing rebuilds, so vLLM
would serve the new body through the old output projection. `finish_weight_update` rebuilds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload
from vllm.platforms import current_platform

from harbor_rl_vllm import wire

logger = init_logger(__name__)

GROUP_TIMEOUT_S = 300.0
"""How long a broadcast waits for the trainer (NCCL has none; a stuck push ends here instead)."""


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = False
    packed_buffer_size_bytes: int = wire.DEFAULT_PACKED_BUFFER_SIZE_BYTES
    packed_num_buffers: int = 2  # accepted for NCCL's wire; gloo broadcasts one buffer at a time


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )
        for name in self.dtype_names:
            wire.torch_dtype(name)


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.init_info: GlooInitInfo | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        # The worker's rank across data-parallel groups, offset past the trainer's ranks, as NCCL's
        # `worker_init_process_group` computes it (nccl_common.py).
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + init_info.rank_offset
        self.group = wire.gloo_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, GROUP_TIMEOUT_S
        )
        self.init_info = init_info

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with torch.accelerator.synchronize(), for NCCL's asynchronous broadcasts; a
        # gloo broadcast has completed when it returns, and a CPU-only torch has no accelerator to sync.
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            self._abandon_reload()
            raise

    def _abandon_reload(self) -> None:
        """After a failed receive (a bad name, the trainer gone mid-push): every layer whose load had not
        completed gets its own tensors back, unprocessed, and its weight loaders unwrapped. vLLM's worker
        has closed the update (`gpu_worker.py`), and the next start would skip layers still marked as
        loading (`initialize_layerwise_reload`), leaving them on the meta device, so a restarted trainer's
        push failed ("'Parameter' object has no attribute 'weight_loader'"). Each layer now holds either
        its old weights or the new ones, whole, and the next full push replaces them all. vLLM's own
        layerwise helpers (`model_loader/reload/layerwise.py`) do the placing."""
        from vllm.model_executor.model_loader.reload import layerwise

        for layer in self.model.modules():
            info = layerwise.get_layerwise_info(layer)
            if info.can_load() and info.kernel_tensors is not None:
                layerwise._place_kernel_tensors(layer, info)
                info.reset()
        layerwise.LOADING_LAYERS.clear()
        if hasattr(self.model, "_original_do_torchao_reload"):
            self.model._do_torchao_reload = self.model._original_do_torchao_reload

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None or self.init_info is None:
            raise RuntimeError("gloo weight transfer is not initialized: call /init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        received = wire.receive(
            self.group, update_info.dtype_names, update_info.shapes, self.init_info.packed,
            self.init_info.packed_buffer_size_bytes,
        )  # fmt: skip
        with disable_mtp_completeness_check():
            for i, tensor in received:
                self.model.load_weights([(update_info.names[i], tensor.to(self.device))])

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        self._rebuild_tied_lm_head()

    def _rebuild_tied_lm_head(self) -> None:
        # vLLM's reload documents the case: "Tied parameters will only reflect processing from one of the
        # parent layers" (model_loader/reload/__init__.py, Limitations 2).
        head = getattr(self.model, "lm_head", None)
        config = self.model_config.hf_config
        if not (current_platform.is_cpu() and head is not None and getattr(config, "tie_word_embeddings", False)):
            return
        quant_method = getattr(head, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(head)

    def shutdown(self) -> None:
        self.group = None
        self.init_info = None
