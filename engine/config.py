"""What `harbor engine` serves and the loaded state behind the app (model, tokenizer, batching loop)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from engine.errors import EngineConfigError, ModelNotFound
from engine.protocol import TokenNamer
from engine.sampling_params import Defaults
from engine.scheduler import BatchScheduler
from engine.weight_transfer import WeightReceiver


class EngineConfig(BaseModel):
    """How `harbor engine` serves a model."""

    model: str = "tiny"
    """`tiny` (built locally for `seed`), `smollm2-135m` or a `.gguf` file (converted once,
    engine.gguf_model), a local Hugging Face model folder, or a Hub id (ORG/NAME, fetched once into the
    Hugging Face cache)."""
    revision: str | None = None
    """Hub revision of a Hub-id `model` (None: the default branch)."""
    served_model_name: str | None = None
    """Name clients send as `model`; defaults to `model`, as in vLLM."""
    seed: int = 0
    """Seed of the tiny model (ignored for a model folder)."""
    cache_dir: str | None = None
    """Where the tiny model is built; default `$HARBOR_CACHE_DIR` or `~/.cache/harbor-rl`."""
    max_model_len: int | None = None
    """Prompt + completion tokens per request; default the model's max_position_embeddings."""
    return_tokens_as_token_ids: bool = False
    """Logprob tokens read `token_id:N` (vLLM's --return-tokens-as-token-ids)."""
    num_threads: int = 1
    """torch CPU threads for the generation loop (one suits a tiny model: more threads spin at barriers
    when the CPU is shared)."""
    max_batch_size: int = 64
    """Sequences decoded together in one step; more wait in the queue."""
    enable_prefix_caching: bool = True
    """Reuse the keys and values of earlier prompts' leading blocks, as vLLM does by default."""
    prefix_cache_mb: float = Field(256.0, gt=0)
    """Memory the prefix cache may hold (least recently used prompts go first)."""
    dtype: str = "float32"
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """Where the model runs: `cuda` (or `auto` with a GPU) puts it on the current GPU. The default CPU
    leaves a GPU to the trainer."""
    weight_transfer_timeout_s: float = 300.0
    """How long a weight-transfer collective may wait for the trainer."""


@dataclasses.dataclass
class EngineState:
    config: EngineConfig
    served_name: str
    model_path: Path
    tokenizer: Any
    scheduler: BatchScheduler
    receiver: WeightReceiver
    defaults: Defaults
    namer: TokenNamer
    max_model_len: int

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.served_name:
            raise ModelNotFound(name)


def _generation_defaults(path: Path) -> tuple[Defaults, list[int]]:
    try:
        raw = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return Defaults(), []
    eos = raw.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
    known = {k: raw[k] for k in ("max_new_tokens", "temperature", "top_p", "top_k") if raw.get(k) is not None}
    return Defaults(**known), eos_ids


def engine_device(requested: str):
    """`auto` -> cuda when torch sees a GPU, else cpu; `cuda` without one is an EngineConfigError."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise EngineConfigError(
            "engine device 'cuda' was asked for but torch sees no GPU: install a CUDA build of torch, "
            "check CUDA_VISIBLE_DEVICES, or serve on --device cpu"
        )
    use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if use_cuda else "cpu")


def load_engine(config: EngineConfig) -> EngineState:
    """Resolve and load the model, and build (not start) the batching loop."""
    import torch

    from engine.tiny_model import load_model_and_tokenizer, resolve_model_path

    torch.set_num_threads(config.num_threads)
    path = resolve_model_path(config.model, config.seed, config.cache_dir, config.revision)
    device = engine_device(config.device)
    model, tokenizer = load_model_and_tokenizer(path, config.dtype)
    model.to(device)
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    max_model_len = min(config.max_model_len or limit, limit)
    defaults, eos_ids = _generation_defaults(path)
    if tokenizer.eos_token_id is not None:
        eos_ids = sorted({*eos_ids, tokenizer.eos_token_id})
    scheduler = BatchScheduler(
        model,
        tokenizer,
        max_model_len=max_model_len,
        eos_token_ids=eos_ids,
        max_batch_size=config.max_batch_size,
        prefix_cache_bytes=int(config.prefix_cache_mb * 2**20) if config.enable_prefix_caching else 0,
        device=device,
    )
    return EngineState(
        config=config,
        served_name=config.served_model_name or config.model,
        model_path=path,
        tokenizer=tokenizer,
        scheduler=scheduler,
        receiver=WeightReceiver(scheduler, timeout_s=config.weight_transfer_timeout_s),
        defaults=defaults,
        namer=TokenNamer(tokenizer, config.return_tokens_as_token_ids),
        max_model_len=max_model_len,
    )
