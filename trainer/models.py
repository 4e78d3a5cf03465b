"""Load the policy to train, with its tokenizer, from a Hugging Face model folder or Hub id.

The trainer never builds models: the embedded engine's `tiny` model is built by `engine.tiny_model`
(the `harbor` CLI resolves the name `tiny` to its folder before it gets here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.errors import TrainerConfigError


def load_policy(name_or_path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from a local model folder or a Hub id, loaded on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    source = str(name_or_path)
    if source in ("tiny", "smollm2-135m") or source.lower().endswith(".gguf"):
        raise TrainerConfigError(
            f"model {source!r} is built into a folder by the embedded engine, not loaded by name: pass its "
            f"folder (engine.tiny_model.resolve_model_path({source!r})), as the harbor CLI does"
        )
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise TrainerConfigError(f"cannot load model {source!r}: {exc}") from exc
    return model.eval(), tokenizer
