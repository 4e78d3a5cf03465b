"""A small model in two forms: the trainer's (Hugging Face names, one tensor per projection) and the one
vLLM serves (q/k/v fused into `qkv_proj`, gate/up into `gate_up_proj`), with vLLM's way of loading a
checkpoint into the latter.

`VllmModel.load_weights` follows vLLM's Qwen2 (`vllm/model_executor/models/qwen2.py`,
`Qwen2Model.load_weights`): a `stacked_params_mapping` sends `q_proj`/`k_proj`/`v_proj` and
`gate_proj`/`up_proj` to their fused parameter's `weight_loader(param, loaded_weight, shard_id)`; any
other name is looked up in `params_dict` (an unknown name is a KeyError) and loaded with its
`weight_loader`, by default vLLM's `default_weight_loader`. The fused loaders copy into a row slice the
way `QKVParallelLinear` / `MergedColumnParallelLinear` do at tensor-parallel size 1. vLLM's layerwise
reload wraps these loaders (`model_executor/model_loader/reload/layerwise.py`), so the loaders take a
`param` argument by that name, as vLLM's do.

It has a 0-dim parameter (`model.layers.N.scale`), like the scalar gates some architectures carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

HIDDEN, KV, INTER, VOCAB, LAYERS = 16, 8, 24, 48, 2


class Proj(nn.Linear):
    def __init__(self, rows: int, cols: int) -> None:
        super().__init__(cols, rows, bias=False)
        with torch.no_grad():
            self.weight.copy_(torch.randn(rows, cols) * 0.1)


class Norm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size) + torch.randn(size) * 0.01)


class TrainerLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        for name, rows in (("q_proj", HIDDEN), ("k_proj", KV), ("v_proj", KV), ("o_proj", HIDDEN)):
            setattr(self.self_attn, name, Proj(rows, HIDDEN))
        self.mlp = nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = Proj(INTER, HIDDEN), Proj(INTER, HIDDEN)
        self.mlp.down_proj = Proj(HIDDEN, INTER)
        self.input_layernorm = Norm(HIDDEN)
        self.scale = nn.Parameter(torch.tensor(1.25))


class TrainerModel(nn.Module):
    """The trainer's copy: Hugging Face names."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.model = nn.Module()
        self.model.embed_tokens = Proj(VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList(TrainerLayer() for _ in range(LAYERS))
        self.model.norm = Norm(HIDDEN)
        self.lm_head = Proj(VOCAB, HIDDEN)

    def step(self, seed: int) -> None:
        """A fake optimizer step: every parameter moves."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


class FusedProj(nn.Module):
    """A fused projection and its shard loader (tensor-parallel size 1)."""

    def __init__(self, shards: dict[str | int, int], cols: int) -> None:
        super().__init__()
        self.offsets: dict[str | int, tuple[int, int]] = {}
        start = 0
        for shard, rows in shards.items():
            self.offsets[shard] = (start, rows)
            start += rows
        self.weight = nn.Parameter(torch.zeros(start, cols))
        self.weight.weight_loader = self.weight_loader

    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: str | int
    ) -> None:
        start, rows = self.offsets[loaded_shard_id]
        assert loaded_weight.shape == (rows, param.shape[1]), (loaded_shard_id, loaded_weight.shape)
        param.data.narrow(0, start, rows).copy_(loaded_weight)


class VllmLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = FusedProj({"q": HIDDEN, "k": KV, "v": KV}, HIDDEN)
        self.self_attn.o_proj = Proj(HIDDEN, HIDDEN)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = FusedProj({0: INTER, 1: INTER}, HIDDEN)
        self.mlp.down_proj = Proj(HIDDEN, INTER)
        self.input_layernorm = Norm(HIDDEN)
        self.scale = nn.Parameter(torch.tensor(0.0))


STACKED = (
    ("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
)  # fmt: skip


class VllmModel(nn.Module):
    """The engine's copy: vLLM's fused layout."""

    def __init__(self, default_weight_loader: Callable, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.default_weight_loader = default_weight_loader
        self.model = nn.Module()
        self.model.embed_tokens = Proj(VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList(VllmLayer() for _ in range(LAYERS))
        self.model.norm = Norm(HIDDEN)
        self.lm_head = Proj(VOCAB, HIDDEN)
        self.to(dtype)
        self.refuse: str | None = None
        """A checkpoint name this model cannot load (the test's load failure at a named tensor)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params_dict = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, loaded_weight in weights:
            if name == self.refuse:
                raise KeyError(name)  # what `params_dict[name]` raises for a name the model lacks
            for param_name, weight_name, shard_id in STACKED:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                param = params_dict[name]
                getattr(param, "weight_loader", self.default_weight_loader)(param, loaded_weight)
            loaded.add(name)
        return loaded

    def served(self) -> dict[str, torch.Tensor]:
        """What the engine serves with, under the trainer's names (fused parameters split again)."""
        out: dict[str, torch.Tensor] = {}
        for name, param in self.named_parameters():
            if name.endswith(("qkv_proj.weight", "gate_up_proj.weight")):
                module = self.get_submodule(name.removesuffix(".weight"))
                for fused, part, shard in STACKED:
                    if fused in name and shard in module.offsets:
                        start, rows = module.offsets[shard]
                        out[name.replace(fused, part)] = param.detach()[start : start + rows].clone()
            else:
                out[name] = param.detach().clone()
        return out
