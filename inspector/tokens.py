"""Token text for the token view, from a local tokenizer (no model hub is contacted)."""

from __future__ import annotations

import functools
from pathlib import Path

from inspector.errors import InspectorError
from inspector.render import TokenDecoder


def load_decoder(spec: str) -> TokenDecoder:
    """A token id -> text function from a `tokenizer.json` file or a local Hugging Face model folder."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise InspectorError(f"--tokenizer {spec!r}: no such file or folder")
    try:
        if path.is_file():
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(path))

            def decode_one(tid: int) -> str:
                return tok.decode([tid], skip_special_tokens=False)
        else:
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)

            def decode_one(tid: int) -> str:
                return hf.decode([tid], skip_special_tokens=False)
    except Exception as exc:  # a folder without a tokenizer, a corrupt file
        raise InspectorError(f"--tokenizer {spec!r}: cannot load a tokenizer: {exc}") from exc
    # Rollouts repeat the same few thousand ids: decode each once.
    return functools.lru_cache(maxsize=200_000)(decode_one)
